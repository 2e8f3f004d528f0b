#!/usr/bin/env bash
# The edge image that can shape its own link from inside its container (services/shaping_api.py,
# netem/inside.py): dsdbed-app plus iptables, libnetfilter-queue and the NetfilterQueue module.
# Swarm edges need it (the orchestrator cannot reach a remote container's veth); so does any
# container edge started with --shape-link.
#
#   bash scripts/build_images.sh          # dsdbed-app:latest first
#   bash scripts/build_shaper_image.sh    # -> dsdbed-shaper:latest  (~10 s)
#
# Nothing is fetched from inside a build (this machine's proxy breaks HTTPS there): the Debian
# packages come from the host's apt (`apt-get download`, same release as the image's base:
# bookworm) and the NetfilterQueue wheel is built on the host (cp311, against
# libnetfilter-queue-dev). Root (docker). DSD_IMAGE, DSD_SHAPER_IMAGE override the names.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "build_shaper_image: $*" >&2; }

APP_IMAGE=${DSD_IMAGE:-dsdbed-app:latest}
SHAPER_IMAGE=${DSD_SHAPER_IMAGE:-dsdbed-shaper:latest}
CONTEXT=build/shaper
PACKAGES="iptables libip4tc2 libip6tc2 libxtables12 libmnl0 libnetfilter-conntrack3 libnfnetlink0 libnftnl11 libnetfilter-queue1"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi

docker image inspect "$APP_IMAGE" >/dev/null 2>&1 || { say "$APP_IMAGE missing: run scripts/build_images.sh"; exit 1; }
base_release=$(docker run --rm --entrypoint cat "$APP_IMAGE" /etc/os-release | sed -n 's/^VERSION_CODENAME=//p')
host_release=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)
[ "$base_release" = "$host_release" ] || {
  say "the image is $base_release, this host $host_release: its packages would not fit"; exit 1; }
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { say "$PY is not Python 3.11 (the image's)"; exit 1; }

mkdir -p "$CONTEXT/debs" "$CONTEXT/wheels"
rm -rf "$CONTEXT"/debs/*.deb "$CONTEXT"/wheels/*.whl "$CONTEXT/app"
# This checkout's code on top of the app image's (which may be older): the shaping code with it.
mkdir -p "$CONTEXT/app"
tar -c --exclude=__pycache__ pyproject.toml dsd services netem orchestrator pairs | tar -x -C "$CONTEXT/app"
(cd "$CONTEXT/debs" && apt-get download $PACKAGES >/dev/null 2>&1) || { say "apt-get download failed"; exit 1; }
"$PY" -m pip wheel -q --no-deps NetfilterQueue==1.1.0 -w "$CONTEXT/wheels" || {
  say "building the NetfilterQueue wheel failed (apt-get install libnetfilter-queue-dev gcc)"; exit 1; }
cat >"$CONTEXT/Dockerfile" <<DOCKERFILE
FROM $APP_IMAGE
LABEL dsdbed.image=shaper
COPY debs /tmp/shaper/debs
COPY wheels /tmp/shaper/wheels
COPY app /app
RUN dpkg -i /tmp/shaper/debs/*.deb >/dev/null \\
 && pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check /tmp/shaper/wheels/*.whl \\
 && rm -rf /tmp/shaper \\
 && python3 -m compileall -q /app \\
 && iptables --version && python3 -c "import netfilterqueue, netem.inside"
DOCKERFILE
docker build -q -t "$SHAPER_IMAGE" "$CONTEXT" >/dev/null
docker image prune -f --filter label=dsdbed.image=shaper >/dev/null
say "image $SHAPER_IMAGE from $APP_IMAGE"
echo "image=$SHAPER_IMAGE"
