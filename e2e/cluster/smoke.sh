#!/usr/bin/env bash
# Smoke test of a running local control plane (the cluster of $KUBECONFIG, else the default one):
#   /version, fake GPU nodes Ready (nodes.sh), a DaemonSet pod Running on each fake node, the
#   authentication.kubernetes.io/node-name extra of a pod-bound ServiceAccount token (SelfSubjectReview),
#   a PodDisruptionBudget making the Eviction API answer 429, a ValidatingAdmissionPolicy denying a
#   request, and (SMOKE_LONG=1) fake nodes staying Ready past KCM's node-monitor grace period (50 s).
# Everything is created in a fresh namespace and removed at the end.
#
# Usage: e2e/cluster/up.sh >/dev/null && e2e/cluster/smoke.sh [SMOKE_LONG=1 for the 70 s Ready check]
set -euo pipefail
PROG=smoke.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

eval "$("$CLUSTER_HERE/build.sh" --print-env)"
K=${KUBECTL:-$GPUNODE_KUBECTL}
if [[ -z ${KUBECONFIG:-} ]]; then
	resolve_cluster_dir ""
	export KUBECONFIG=$D/kubeconfig
fi
[[ -f $KUBECONFIG ]] || die "no kubeconfig at $KUBECONFIG (run up.sh first)"
NS=gpunode-smoke-$RANDOM
PREFIX=smoke-node-$RANDOM
TMP=$(mktemp -d)
FAILED=0
cleanup() {
	"$K" delete ns "$NS" --wait=false >/dev/null 2>&1 || true
	"$K" delete validatingadmissionpolicybinding,validatingadmissionpolicy "$NS" >/dev/null 2>&1 || true
	"$K" delete nodes -l "gpunode.local/smoke=$PREFIX" >/dev/null 2>&1 || true
	rm -rf "$TMP"
}
trap cleanup EXIT
ok() { log "ok   $*"; }
bad() { log "FAIL $*"; FAILED=1; }
# poll CMD until it succeeds or SECONDS-deadline
poll() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		((SECONDS < deadline)) || return 1
		sleep 0.2 # poll interval
	done
}

v=$("$K" version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1)
if [[ $v == "$GPUNODE_K8S_VERSION" ]]; then
	ok "server version $v"
else
	bad "server version '$v' != $GPUNODE_K8S_VERSION"
fi

mapfile -t NODES < <(NODE_WAIT_TIMEOUT=60 "$CLUSTER_HERE/nodes.sh" 3 "$PREFIX")
"$K" label nodes "${NODES[@]}" "gpunode.local/smoke=$PREFIX" >/dev/null
ok "3 fake nodes Ready: ${NODES[*]}"
cap=$("$K" get node "${NODES[0]}" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')
if [[ $cap == 8 ]]; then
	ok "allocatable nvidia.com/gpu=8 kept by kwok"
else
	bad "allocatable nvidia.com/gpu='$cap'"
fi

"$K" create ns "$NS" >/dev/null
"$K" -n "$NS" create sa probe >/dev/null
"$K" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: probe, namespace: $NS}
spec:
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec:
      serviceAccountName: probe
      nodeSelector: {gpunode.local/smoke: $PREFIX}
      containers: [{name: c, image: registry.invalid/probe:1}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: $NS}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {gpunode.local/smoke: $PREFIX}
      containers: [{name: c, image: registry.invalid/web:1, resources: {limits: {nvidia.com/gpu: "1"}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: $NS}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
EOF
ds_ready() { [[ $("$K" -n "$NS" get ds probe -o jsonpath='{.status.numberReady}') == 3 ]]; }
if poll 60 ds_ready; then
	ok "DaemonSet: a Running pod on each fake node ($("$K" -n "$NS" get pods -l app=probe -o jsonpath='{.items[*].spec.nodeName}'))"
else
	bad "DaemonSet pods not ready: $("$K" -n "$NS" get pods -o wide 2>&1)"
fi

# pod-bound token -> SelfSubjectReview as that token (no client certificate)
pod=$("$K" -n "$NS" get pods -l app=probe -o jsonpath='{.items[0].metadata.name}')
uid=$("$K" -n "$NS" get pod "$pod" -o jsonpath='{.metadata.uid}')
node=$("$K" -n "$NS" get pod "$pod" -o jsonpath='{.spec.nodeName}')
tok=$("$K" -n "$NS" create token probe --bound-object-kind=Pod --bound-object-name="$pod" --bound-object-uid="$uid")
"$K" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$TMP/ca.crt"
server=$("$K" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
printf 'apiVersion: v1\nkind: Config\n' >"$TMP/empty.kubeconfig"
got=$(printf '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' |
	"$K" --kubeconfig="$TMP/empty.kubeconfig" --server="$server" --certificate-authority="$TMP/ca.crt" --token="$tok" \
		create --validate=false -f - -o jsonpath='{.status.userInfo.extra.authentication\.kubernetes\.io/node-name[0]}')
if [[ $got == "$node" ]]; then
	ok "pod-bound token: extra authentication.kubernetes.io/node-name=$got"
else
	bad "pod-bound token node-name '$got' != '$node'"
fi

pdb_ready() { [[ $("$K" -n "$NS" get pdb web -o jsonpath='{.status.currentHealthy}/{.status.observedGeneration}') == 2/1 ]]; }
poll 60 pdb_ready || bad "PDB status not computed (is the disruption controller running?)"
wpod=$("$K" -n "$NS" get pods -l app=web -o jsonpath='{.items[0].metadata.name}')
out=$(printf '{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"%s","namespace":"%s"}}' "$wpod" "$NS" |
	"$K" create --raw "/api/v1/namespaces/$NS/pods/$wpod/eviction" -f - 2>&1) || true
if [[ $out == *TooManyRequests* || $out == *"disruption budget"* ]]; then
	ok "eviction blocked by PDB: 429 ($out)"
else
	bad "eviction not refused with 429: $out"
fi

"$K" apply -f - >/dev/null <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: $NS}
spec:
  failurePolicy: Fail
  matchConstraints:
    namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $NS}}
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  validations: [{expression: "object.metadata.name != 'forbidden'", message: "smoke VAP"}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: $NS}
spec: {policyName: $NS, validationActions: [Deny]}
EOF
vap_denies() {
	if "$K" -n "$NS" create configmap forbidden >/dev/null 2>&1; then
		"$K" -n "$NS" delete configmap forbidden >/dev/null 2>&1
		return 1
	fi
}
if poll 30 vap_denies; then
	ok "ValidatingAdmissionPolicy active (request denied)"
else
	bad "ValidatingAdmissionPolicy did not deny"
fi

if [[ ${SMOKE_LONG:-} == 1 ]]; then
	log "...  watching the fake nodes for 70 s (KCM node-monitor grace period is 50 s)"
	end=$((SECONDS + 70))
	notready=
	while ((SECONDS < end)); do
		s=$("$K" get nodes "${NODES[@]}" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{.spec.taints}{" "}{end}')
		[[ $s == *False* || $s == *Unknown* || $s == *unreachable* || $s == *not-ready* ]] && notready=$s
		sleep 2 # sampling interval of the 70 s observation (poll)
	done
	if [[ -z $notready ]]; then
		ok "fake nodes stayed Ready for 70 s (leases renewed by kwok)"
	else
		bad "a fake node went NotReady: $notready"
	fi
fi
if ((FAILED == 0)); then
	log "$PROG: all checks passed"
else
	die "some checks failed"
fi
