#!/usr/bin/env bash
# Create the kind cluster of kind-config.yaml, build the operator and node-probe images and load
# them into it. Needs docker and kind on the PATH (not available on machines without a Docker
# engine; there, the local control plane of e2e/cluster/ is used instead).
#
# Usage:  e2e/kind/up.sh            prints the kubeconfig path as its last line:
#         GPUNODE_KUBECONFIG=$(e2e/kind/up.sh | tail -1) make test
#         INSTALL_CHART=1 e2e/kind/up.sh    also installs the chart with the images just loaded
#                                           (to try gpunode; the e2e suite installs what it needs
#                                           itself, so leave it off for `make test`)
# Environment: KIND_CLUSTER (default gpunode), IMAGE_TAG (default dev), KIND (default kind),
#   HELM (default helm), INSTALL_CHART (default off), RELEASE (default gpunode-kind),
#   NAMESPACE (default gpunode-kind). The release name differs from the e2e suite's accounts
#   (gpunode in gpunode-system), so both can live in one cluster.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
name=${KIND_CLUSTER:-gpunode}
tag=${IMAGE_TAG:-dev}
kind=${KIND:-kind}
helm=${HELM:-helm}
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

if [ "${INSTALL_CHART:-}" = 1 ]; then
	command -v "$helm" >/dev/null || die "helm is not installed"
	release=${RELEASE:-gpunode-kind}
	namespace=${NAMESPACE:-gpunode-kind}
	log "installing the chart as $release in $namespace"
	# kind nodes have no NVIDIA runtime: the probes run with the default runtime and report NVML
	# as unavailable (their nodes turn Unknown, never Drifted); cooling and RoCE are read from the
	# node containers' /sys. Images were loaded above, so never pull them.
	KUBECONFIG=$kubeconfig "$helm" upgrade --install "$release" "$repo/charts/gpunode" \
		--namespace "$namespace" --create-namespace \
		--set operator.image.tag="$tag" --set operator.image.pullPolicy=Never \
		--set nodeProbe.image.tag="$tag" --set nodeProbe.image.pullPolicy=Never \
		--set nodeProbe.runtimeClassName= \
		--wait --timeout 5m >&2 || die "helm install of $release failed"
fi
printf '%s\n' "$kubeconfig"
