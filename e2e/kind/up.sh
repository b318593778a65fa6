#!/usr/bin/env bash
# Create the kind cluster of kind-config.yaml, build the operator and node-probe images and load
# them into it. Needs docker and kind on the PATH (not available on machines without a Docker
# engine; there, the local control plane of e2e/cluster/ is used instead).
#
# Usage:  e2e/kind/up.sh            prints the kubeconfig path as its last line:
#         GPUNODE_KUBECONFIG=$(e2e/kind/up.sh | tail -1) make test
# Environment: KIND_CLUSTER (default gpunode), IMAGE_TAG (default dev), KIND (default kind).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
name=${KIND_CLUSTER:-gpunode}
tag=${IMAGE_TAG:-dev}
kind=${KIND:-kind}
log() { printf '%s\n' "$*" >&2; }
die() { log "e2e/kind/up.sh: $*"; exit 1; }

command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "no Docker engine is running (docker info failed)"
command -v "$kind" >/dev/null || die "kind is not installed (go install sigs.k8s.io/kind@v0.30.0)"

kubeconfig=$repo/.cluster/kind-$name.kubeconfig
mkdir -p "$(dirname "$kubeconfig")"
if ! "$kind" get clusters 2>/dev/null | grep -qx "$name"; then
	log "creating kind cluster $name"
	"$kind" create cluster --name "$name" --config "$here/kind-config.yaml" --kubeconfig "$kubeconfig" >&2 ||
		die "kind create cluster failed"
else
	"$kind" get kubeconfig --name "$name" >"$kubeconfig" || die "kind get kubeconfig failed"
fi

for target in operator node-probe; do
	image=gpunode/$target:$tag
	log "building $image"
	docker build -f "$here/Dockerfile" --target "$target" -t "$image" "$repo" >&2 || die "docker build of $image failed"
	"$kind" load docker-image --name "$name" "$image" >&2 || die "kind load of $image failed"
done
printf '%s\n' "$kubeconfig"
