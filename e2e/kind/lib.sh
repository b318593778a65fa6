# Shared settings of the kind cluster scripts (sourced by e2e/kind/*.sh).
#   GPUNODE_CACHE          cache root (default ~/.cache/gpunode): the engine's data (images), the
#                          node image's parts, the built programs
#   GPUNODE_KIND_CLUSTER   the cluster's name (default gpunode-kind)
# The Docker daemon is the project's own: its socket, pidfile and exec root live under
# /run/gpunode-docker, its data under $GPUNODE_CACHE/docker. Nothing here uses a system daemon.
KIND_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$KIND_HERE/../.." && pwd)
CACHE=${GPUNODE_CACHE:-$HOME/.cache/gpunode}
KIND_NAME=${GPUNODE_KIND_CLUSTER:-gpunode-kind}
ENGINE_RUN=/run/gpunode-docker
ENGINE_DATA=$CACHE/docker
STATE=$REPO/.cluster/kind-$KIND_NAME
KIND_BIN=$CACHE/kind/bin
# GPUNODE_DOCKER_HOST: another engine (`make images` on a machine with its own Docker).
export DOCKER_HOST=${GPUNODE_DOCKER_HOST:-unix://$ENGINE_RUN/docker.sock}
# Debian's docker CLI matches its daemon (20.10); kind finds `docker` on the PATH.
export PATH=$KIND_BIN:$PATH
export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOWORK=off

log() { printf '%s\n' "$*" >&2; }
die() { printf '%s: %s\n' "${PROG:-e2e/kind}" "$*" >&2; exit 1; }
hash_of() { # FILES/DIRS... -> 16 hex digits over their paths' content (sorted, recursive)
	find "$@" -type f -print0 | sort -z | xargs -0 sha256sum | sed "s|$REPO/||" | sha256sum | cut -c1-16
}
