#!/usr/bin/env bash
# Create (or update) N fake GPU nodes managed by kwok in the cluster of $KUBECONFIG, and wait until
# they are Ready. Idempotent: server-side apply (field manager gpunode-nodes) of
# e2e/cluster/templates/fake-gpu-node.yaml rendered per node.
#
# Usage:  nodes.sh N [PREFIX] [PRODUCT]
#   N        number of nodes (names PREFIX-000 .. PREFIX-<N-1>, zero-padded to at least 3 digits)
#   PREFIX   node name prefix (default gpu-node)
#   PRODUCT  nvidia.com/gpu.product label (default NVIDIA-H100-80GB-HBM3)
# Environment (defaults in brackets):
#   KUBECONFIG            cluster to use [e2e/cluster default cluster's kubeconfig if unset]
#   KUBECTL               kubectl binary [$GPUNODE_KUBECTL from build.sh --print-env, else kubectl]
#   NODE_GPUS [8] NODE_GPU_MEMORY [81559] (MiB) NODE_CPU [32] NODE_MEMORY [256Gi] NODE_PODS [110]
#   NODE_START [0]        index of the first node (add nodes 10..19: NODE_START=10 nodes.sh 10)
#   NODE_WAIT_TIMEOUT     seconds to wait for Ready [120]; 0 = do not wait
# Prints the node names on stdout, one per line.
set -euo pipefail
PROG=nodes.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case "${1:-}" in -h | --help | "") sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; [[ -n ${1:-} ]]; exit ;; esac
N=$1
PREFIX=${2:-gpu-node}
PRODUCT=${3:-NVIDIA-H100-80GB-HBM3}
[[ $N =~ ^[0-9]+$ ]] || die "N must be a number (got '$N')"
[[ $PREFIX =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "PREFIX must be a DNS-1123 name (got '$PREFIX')"
[[ $PRODUCT =~ ^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$ ]] || die "PRODUCT must be a label value (got '$PRODUCT')"
START=${NODE_START:-0}
GPUS=${NODE_GPUS:-8} GPU_MEMORY=${NODE_GPU_MEMORY:-81559} CPU=${NODE_CPU:-32} MEMORY=${NODE_MEMORY:-256Gi} PODS=${NODE_PODS:-110}
WAIT=${NODE_WAIT_TIMEOUT:-120}

if [[ -z ${KUBECTL:-} ]]; then
	KUBECTL=kubectl
	if envlines=$("$CLUSTER_HERE/build.sh" --print-env 2>/dev/null); then
		eval "$envlines"
		KUBECTL=$GPUNODE_KUBECTL
	fi
fi
if [[ -z ${KUBECONFIG:-} ]]; then
	resolve_cluster_dir ""
	export KUBECONFIG=$D/kubeconfig
	[[ -f $KUBECONFIG ]] || die "KUBECONFIG is not set and $KUBECONFIG does not exist (run up.sh first)"
fi
((N > 0)) || exit 0

width=3
((${#N} > width)) && width=${#N}
template=$(<"$CLUSTER_HERE/templates/fake-gpu-node.yaml")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# apply in up to 4 parallel kubectl processes (one request per node each)
PAR=$(((N + 49) / 50))
((PAR <= 4)) || PAR=4
names=()
for ((i = START; i < START + N; i++)); do
	printf -v name '%s-%0*d' "$PREFIX" "$width" "$i"
	names+=("$name")
	doc=$template
	doc=${doc//@NAME@/$name}
	doc=${doc//@PRODUCT@/$PRODUCT}
	doc=${doc//@GPUS@/$GPUS}
	doc=${doc//@GPU_MEMORY@/$GPU_MEMORY}
	doc=${doc//@CPU@/$CPU}
	doc=${doc//@MEMORY@/$MEMORY}
	doc=${doc//@PODS@/$PODS}
	printf -- '---\n%s\n' "$doc" >>"$TMP/nodes-$((i % PAR)).yaml"
done

t0=$SECONDS
log "$PROG: applying $N fake node(s) ${names[0]} .. ${names[-1]} ($PRODUCT, $GPUS GPUs)"
pids=()
for f in "$TMP"/nodes-*.yaml; do
	"$KUBECTL" apply --server-side --field-manager=gpunode-nodes --force-conflicts -f "$f" >"$f.out" 2>&1 &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
if ((rc)); then
	cat "$TMP"/*.out | grep -v ' serverside-applied$' | tail -n 20 >&2
	die "kubectl apply of the fake nodes failed"
fi
log "$PROG: applied in $((SECONDS - t0))s"

# Ready when every one of our nodes has condition Ready=True (one list per poll, not a watch per node)
not_ready() {
	"$KUBECTL" get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
		awk -v want="${names[*]}" 'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1 }
			$2 == "True" && ($1 in need) { delete need[$1] } END { c = 0; for (k in need) c++; print c }'
}
if ((WAIT > 0)); then
	deadline=$((SECONDS + WAIT))
	while :; do
		left=$(not_ready) || left=$N
		((left == 0)) && break
		((SECONDS < deadline)) || die "$left of $N fake node(s) not Ready within ${WAIT}s (is kwok running? see the cluster's logs/kwok.log)"
		sleep 0.5 # poll interval
	done
	log "$PROG: $N node(s) Ready in $((SECONDS - t0))s"
fi
printf '%s\n' "${names[@]}"
