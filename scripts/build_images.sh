#!/usr/bin/env bash
# Build the testbed's image (dsdbed-app, both services) without needing a container registry.
#
#   1. base image: ${DSD_BASE_IMAGE:-python:3.11-slim} if it is here or can be pulled; else a
#      local Debian bookworm base, dsdbed-base:bookworm, made by debootstrap and `docker import`
#   2. wheelhouse: build/wheelhouse/, the project's runtime dependencies (pyproject.toml) as
#      cp311 manylinux wheels, downloaded on the host (pip inside a build cannot get through
#      this machine's HTTPS proxy; the build mounts the wheelhouse and installs with --no-index),
#      and the shaping extra (NetfilterQueue, which has no wheel on PyPI) built here when the
#      host's python is 3.11: the compose file's orchestrator service shapes links with it
#   3. `docker compose build` (BuildKit: the Dockerfile's RUN --mount needs it)
#
# Each step prints `build_images: STEP took N s`; the last line is key=value pairs. Re-running
# reuses the base image, the wheelhouse (while the requirements are unchanged) and the build
# cache. Root (debootstrap, docker).
#   DSD_REBUILD_BASE=1   make dsdbed-base:bookworm again even if it exists
#   DSD_PULL_BASE=1      try the registry for the base image first (off by default: a machine
#                        without a registry would only wait for a failed lookup)
#   DSD_DEBIAN_MIRROR=…  the Debian mirror for debootstrap (default: from this machine's apt sources)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "build_images: $*" >&2; }
now() { date +%s.%N; }
took() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

LOCAL_BASE=dsdbed-base:bookworm
# Bumped when the local base's package list changes: an older base is made again.
LOCAL_BASE_VERSION=2
REQUESTED_BASE=${DSD_BASE_IMAGE:-python:3.11-slim}
WHEELHOUSE=build/wheelhouse
ARCH=$(uname -m)   # x86_64 or aarch64: the wheel platform tags and the Debian architecture
case "$ARCH" in
  x86_64) DEB_ARCH=amd64 ;;
  aarch64) DEB_ARCH=arm64 ;;
  *) say "unsupported architecture $ARCH"; exit 1 ;;
esac

if ! docker info >/dev/null 2>&1 || ! docker compose version >/dev/null 2>&1; then
  bash scripts/docker_setup.sh
fi

# ---- 1. base image -----------------------------------------------------------------------------
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

debian_mirror() {
  if [ -n "${DSD_DEBIAN_MIRROR:-}" ]; then echo "$DSD_DEBIAN_MIRROR"; return; fi
  # The first Debian (not -security) URI of this machine's apt sources, deb822 or one-line style.
  local uri
  uri=$( (grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}';
          grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}') |
         grep -v -- '-security' | grep '/debian/\?$' | head -n 1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

ROOTFS=""
trap '[ -z "$ROOTFS" ] || rm -rf "$ROOTFS"' EXIT

make_local_base() {
  local rootfs mirror
  mirror=$(debian_mirror)
  rootfs=$(mktemp -d /var/tmp/dsdbed-rootfs-XXXXXX)
  ROOTFS=$rootfs
  chmod 755 "$rootfs"   # mktemp makes it 700; it becomes the image's / and must be traversable
  say "debootstrap bookworm ($DEB_ARCH) from $mirror into $rootfs"
  debootstrap --variant=minbase --arch="$DEB_ARCH" --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
    --include=python3,python3-venv,ca-certificates,iproute2,iputils-ping,netbase,libstdc++6,iptables,libnetfilter-queue1 \
    bookworm "$rootfs" "$mirror" >/var/tmp/dsdbed-debootstrap.log 2>&1 || {
      say "debootstrap failed; log: /var/tmp/dsdbed-debootstrap.log"; tail -n 20 /var/tmp/dsdbed-debootstrap.log >&2
      return 1; }
  # Caches and docs only: the .pyc files the packages compiled stay (imports are 2x faster).
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
         "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
         "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
  tar --numeric-owner -C "$rootfs" -c . |
    docker import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' --change 'LABEL dsdbed.image=base' \
      --change "LABEL dsdbed.base-version=$LOCAL_BASE_VERSION" \
      --message "dsdbed: debootstrap --variant=minbase bookworm" - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
  ROOTFS=""
}

t0=$(now)
base_s=0
if have_image "$REQUESTED_BASE"; then
  BASE_IMAGE=$REQUESTED_BASE
elif [ "${DSD_REBUILD_BASE:-0}" != 1 ] && have_image "$LOCAL_BASE" &&
     [ "$(docker image inspect --format '{{index .Config.Labels "dsdbed.base-version"}}' "$LOCAL_BASE")" = "$LOCAL_BASE_VERSION" ]; then
  BASE_IMAGE=$LOCAL_BASE
elif [ "${DSD_PULL_BASE:-0}" = 1 ] && timeout 60 docker pull -q "$REQUESTED_BASE" >/dev/null 2>&1; then
  BASE_IMAGE=$REQUESTED_BASE
else
  say "$REQUESTED_BASE is not here and cannot be pulled: building $LOCAL_BASE"
  command -v debootstrap >/dev/null || bash scripts/docker_setup.sh
  make_local_base
  BASE_IMAGE=$LOCAL_BASE
fi
base_s=$(took "$t0")
say "base image $BASE_IMAGE; took $base_s s"

# ---- 2. wheelhouse -----------------------------------------------------------------------------
t0=$(now)
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
mkdir -p "$WHEELHOUSE"
# The runtime dependencies are pyproject's [project].dependencies, nothing else: the image
# runs the services, not the tests.
"$PY" - >"$WHEELHOUSE/requirements.txt.new" <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
EOF
if [ -f "$WHEELHOUSE/.complete" ] && cmp -s "$WHEELHOUSE/requirements.txt.new" "$WHEELHOUSE/requirements.txt"; then
  rm "$WHEELHOUSE/requirements.txt.new"
  say "wheelhouse up to date"
else
  mv "$WHEELHOUSE/requirements.txt.new" "$WHEELHOUSE/requirements.txt"
  rm -f "$WHEELHOUSE/.complete"
  platforms=()
  for tag in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1 linux; do
    platforms+=(--platform "${tag}_${ARCH}")
  done
  # Bookworm's python3 is 3.11 (and so is python:3.11-slim): cp311 wheels whatever the host runs.
  "$PY" -m pip download -q -d "$WHEELHOUSE" --only-binary :all: \
    --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}" \
    -r "$WHEELHOUSE/requirements.txt" 2>&1 | { grep -v 'is neither a file nor a directory' || true; } >&2
  [ "${PIPESTATUS[0]}" = 0 ] || { say "pip download failed"; exit 1; }
  touch "$WHEELHOUSE/.complete"
fi
# The shaping extra for the orchestrator service: NetfilterQueue (the NFQUEUE shaper where the
# kernel has no netem). PyPI has only its sdist, so it is built here, for the host's python, which
# must be the image's 3.11; elsewhere the service can shape with kernel netem only.
SHAPING_SPEC=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["shaping"][0])')
if ls "$WHEELHOUSE"/[Nn]etfilter[Qq]ueue-*-cp311-*.whl >/dev/null 2>&1; then
  :
elif [ "$("$PY" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" = True ] &&
     "$PY" -m pip wheel -q --no-deps -w "$WHEELHOUSE" "$SHAPING_SPEC" >build/shaping-wheel.log 2>&1; then
  say "built $SHAPING_SPEC for the image"
else
  say "no cp311 wheel of $SHAPING_SPEC (log: build/shaping-wheel.log): the orchestrator service can shape with kernel netem only"
fi
if ls "$WHEELHOUSE"/[Nn]etfilter[Qq]ueue-*-cp311-*.whl >/dev/null 2>&1; then
  echo "$SHAPING_SPEC" >"$WHEELHOUSE/shaping-requirements.txt"
else
  : >"$WHEELHOUSE/shaping-requirements.txt"
fi
wheelhouse_s=$(took "$t0")
wheelhouse_mib=$(du -sm "$WHEELHOUSE" | cut -f1)
say "wheelhouse $WHEELHOUSE ($wheelhouse_mib MiB); took $wheelhouse_s s"

# ---- 3. the image ------------------------------------------------------------------------------
t0=$(now)
DSD_BASE_IMAGE=$BASE_IMAGE COMPOSE_BAKE=false docker compose build --progress plain >build/compose-build.log 2>&1 || {
  say "docker compose build failed; last lines of build/compose-build.log:"; tail -n 30 build/compose-build.log >&2; exit 1; }
build_s=$(took "$t0")
# Earlier builds of ours, untagged now (dangling); the build cache stays for the next build.
docker image prune -f --filter label=dsdbed.image=app >/dev/null
docker image prune -f --filter label=dsdbed.image=base >/dev/null
images=$(docker compose config --images)   # no `| head`: with pipefail, SIGPIPE would fail the script
image=${images%%$'\n'*}
image_mib=$(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%d", $1 / 1048576}')
say "image $image ($image_mib MiB) from $BASE_IMAGE; took $build_s s"
echo "base_image=$BASE_IMAGE base_s=$base_s wheelhouse_s=$wheelhouse_s wheelhouse_mib=$wheelhouse_mib" \
     "build_s=$build_s image=$image image_mib=$image_mib"
