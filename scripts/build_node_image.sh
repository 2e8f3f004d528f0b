#!/usr/bin/env bash
# A swarm node as a container (Docker-in-Docker) for trying the swarm launcher on several nodes on
# one host: dsdbed-base:bookworm (scripts/build_images.sh) plus Debian's own Docker engine, which
# the node runs as its own dockerd (orchestrator/launchers/swarm_local.py starts the nodes).
#
#   bash scripts/build_images.sh        # dsdbed-base:bookworm first
#   bash scripts/build_node_image.sh    # -> dsdbed-node:latest  (~15 s)
#
# Nothing is fetched from inside the build: the packages come from the host's apt (`apt-get
# download`, the base's release: bookworm). Root (docker). DSD_NODE_IMAGE overrides the name.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "build_node_image: $*" >&2; }

BASE_IMAGE=${DSD_NODE_BASE_IMAGE:-dsdbed-base:bookworm}
NODE_IMAGE=${DSD_NODE_IMAGE:-dsdbed-node:latest}
CONTEXT=build/node
# docker.io and what it needs beyond the base (minbase + iptables, iproute2, python3)
PACKAGES="docker.io containerd runc tini libdevmapper1.02.1 dmsetup libseccomp2 adduser lsb-base init-system-helpers"

docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || { say "$BASE_IMAGE missing: run scripts/build_images.sh"; exit 1; }
base_release=$(docker run --rm --entrypoint cat "$BASE_IMAGE" /etc/os-release | sed -n 's/^VERSION_CODENAME=//p')
host_release=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)
[ "$base_release" = "$host_release" ] || {
  say "the base is $base_release, this host $host_release: its packages would not fit"; exit 1; }

mkdir -p "$CONTEXT/debs"
rm -f "$CONTEXT"/debs/*.deb
(cd "$CONTEXT/debs" && apt-get download $PACKAGES >/dev/null 2>&1) || { say "apt-get download failed"; exit 1; }
cat >"$CONTEXT/entrypoint.sh" <<'ENTRY'
#!/bin/sh
# A nested engine needs what docker:dind sets up: securityfs (AppArmor's check) and a /tmp of its own.
set -e
mount -t securityfs none /sys/kernel/security 2>/dev/null || true
mount -t tmpfs none /tmp 2>/dev/null || true
# Without --privileged /sys, /proc/sys and the cgroup hierarchies are mounted read-only; the engine writes them.
mount -o remount,rw /sys 2>/dev/null || true
mount -o remount,rw /proc/sys 2>/dev/null || true
for d in /sys/fs/cgroup/*; do mount -o remount,bind,rw "$d" 2>/dev/null || true; done
exec dockerd --host=unix:///var/run/docker.sock "$@"
ENTRY
cat >"$CONTEXT/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
LABEL dsdbed.image=node
COPY debs /tmp/node/debs
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && dpkg -i /tmp/node/debs/*.deb >/dev/null \\
 && rm -rf /tmp/node \\
 && dockerd --version && iptables --version
COPY entrypoint.sh /usr/local/bin/dsdbed-node
# The node's images and containers: a volume, since overlay2 cannot sit on the container's overlay.
VOLUME /var/lib/docker
ENTRYPOINT ["/usr/local/bin/dsdbed-node"]
DOCKERFILE
chmod +x "$CONTEXT/entrypoint.sh"
docker build -q -t "$NODE_IMAGE" "$CONTEXT" >/dev/null
docker image prune -f --filter label=dsdbed.image=node >/dev/null
say "image $NODE_IMAGE from $BASE_IMAGE"
echo "image=$NODE_IMAGE"
