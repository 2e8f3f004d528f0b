#!/usr/bin/env bash
# Set up, then run the whole test suite. As root on Debian/Ubuntu this also installs and starts
# Docker (scripts/docker_setup.sh) so the compose tests run; tests that need root, Docker or the
# model pair skip only where those cannot be had, and the summary says which and why.
# DSD_REQUIRE_DOCKER=1 (CI) turns a failed Docker setup into a failure instead of skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! bash scripts/docker_setup.sh; then
    if [ "${DSD_REQUIRE_DOCKER:-0}" = 1 ]; then
      echo "test: Docker setup failed and DSD_REQUIRE_DOCKER=1" >&2
      exit 1
    fi
    echo "test: Docker setup failed; the compose tests will skip" >&2
  fi
fi
export HF_HUB_OFFLINE=1
# the slowest tests are named at the end, so a suite growing past CI's time shows where it went
exec .venv/bin/python -m pytest --durations=30 "$@"
