#!/usr/bin/env bash
# What one write costs the API server: CPU milliseconds of kube-apiserver and etcd per request
# (from /proc/<pid>/stat around a run of sequential requests on one keep-alive connection) for
# the writes a fleet of probes makes. Why the probe heartbeats with a Lease and rewrites its
# report only on a material change (docs/benchmarks/README.md, "The fleet's own writes").
#
# Usage:  bench/write-cost.sh [REQUESTS]      (default 500 per kind; about two minutes)
# Starts the local control plane .cluster/write-cost (stopped and purged afterwards), one KWOK
# node with its healthy 8x H100 report, then times:
#   report status, server-side apply    the whole status with a new observedAt (a report heartbeat)
#   report status, merge patch          only observedAt (the cheapest report write there is)
#   heartbeat Lease, server-side apply  what the probe writes instead
#                                       (publish/kube_sink.rs renew_lease)
#   Node label, merge patch             a built-in object of similar size, for scale
#   Node status, server-side apply      gpunode's record of a node (labels, annotations and its
#                                       condition, field manager gpunode-operator, nodes/status)
#   report, get                         reading it back
# Prints a Markdown table; with WRITE_COST_JSON=<file> also writes the figures there as JSON
# (bench/run.sh keeps them in docs/benchmarks/raw/write-cost.json for the cost model).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:-500}
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "write-cost.sh: REQUESTS must be a positive number (got '$N')" >&2; exit 2; }
NAME=write-cost
D=$REPO/.cluster/$NAME
W=$(mktemp -d)
trap 'rm -rf "$W"; "$REPO/e2e/cluster/down.sh" "$NAME" --purge >/dev/null 2>&1 || true' EXIT
cd "$REPO"

KUBECONFIG=$(e2e/cluster/up.sh "$NAME" | tail -1)
export KUBECONFIG
# shellcheck source=/dev/null
source "$D/cluster.env"
kubectl apply --server-side -f charts/gpunode/crds/ >/dev/null
kubectl create namespace gpunode-system >/dev/null
e2e/cluster/nodes.sh 1 >/dev/null 2>&1
NODE=gpu-node-000

# Payloads: one file per request, each a real change (an unchanged apply writes nothing).
python3 - "$W" "$N" "$NODE" "$REPO/operator/tests/fixtures/evaluate/healthy-h100-report.yaml" <<'PY'
import json, sys, yaml
w, n, node, fixture = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
r = yaml.safe_load(open(fixture))
status = r["status"]
json.dump({"apiVersion": r["apiVersion"], "kind": "GpuNodeReport", "metadata": {"name": node},
           "spec": {"nodeName": node}}, open(f"{w}/object.json", "w"))
def t(i):
    return "2026-11-30T%02d:%02d:%02d.%06dZ" % (i // 3600 % 24, i // 60 % 60, i % 60, i)
for i in range(n):
    s = dict(status, observedAt=t(i)[:19] + "Z")
    json.dump({"apiVersion": r["apiVersion"], "kind": "GpuNodeReport", "status": s}, open(f"{w}/ssa-{i}.json", "w"))
    json.dump({"status": {"observedAt": t(i + n)[:19] + "Z"}}, open(f"{w}/merge-{i}.json", "w"))
    json.dump({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "gpunode-probe-" + node, "labels": {"gpunode.dev/heartbeat": "node-probe"}},
               "spec": {"holderIdentity": node, "leaseDurationSeconds": 180, "renewTime": t(i)}},
              open(f"{w}/lease-{i}.json", "w"))
    json.dump({"metadata": {"labels": {"bench.gpunode.dev/n": str(i)}}}, open(f"{w}/label-{i}.json", "w"))
    json.dump({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": node,
                            "labels": {"gpunode.dev/policy": "bench", "gpunode.dev/state": "compliant"},
                            "annotations": {}},
               "status": {"conditions": [{"type": "GpuPolicyCompliant", "status": "True", "reason": "Compliant",
                                          "message": "every check of policy bench passes",
                                          "lastTransitionTime": "2026-11-30T00:00:00Z",
                                          "lastHeartbeatTime": t(i)[:19] + "Z"}]}},
              open(f"{w}/record-{i}.json", "w"))
PY
kubectl apply --server-side -f "$W/object.json" >/dev/null
kubectl patch gpunodereport "$NODE" --subresource=status --type=merge \
	--patch-file <(python3 -c "import json,sys; print(json.dumps({'status': json.load(open('$W/ssa-0.json'))['status']}))") >/dev/null

# One curl process, requests in sequence on one connection.
curl_cfg() { # URL METHOD CONTENT-TYPE PAYLOAD-PREFIX
	local i
	for ((i = 0; i < N; i++)); do
		printf 'url = "%s"\nrequest = "%s"\n' "$1" "$2"
		if [[ -n $4 ]]; then printf 'header = "Content-Type: %s"\ndata-binary = "@%s%d.json"\n' "$3" "$4" "$i"; fi
		printf 'cacert = "%s/pki/ca.crt"\ncert = "%s/pki/admin.crt"\nkey = "%s/pki/admin.key"\n' "$D" "$D" "$D"
		printf 'silent\noutput = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n'
		if ((i < N - 1)); then echo next; fi
	done
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
measure() { # LABEL URL METHOD CONTENT-TYPE PAYLOAD-PREFIX KEY
	curl_cfg "$2" "$3" "$4" "$5" >"$W/curl.cfg"
	local a0 e0 t0 a1 e1 t1 codes
	a0=$(cpu_ticks "$GPUNODE_PID_KUBE_APISERVER") e0=$(cpu_ticks "$GPUNODE_PID_ETCD") t0=$(date +%s.%N)
	codes=$(curl -K "$W/curl.cfg" | sort | uniq -c | tr -s ' ' | tr '\n' ',')
	a1=$(cpu_ticks "$GPUNODE_PID_KUBE_APISERVER") e1=$(cpu_ticks "$GPUNODE_PID_ETCD") t1=$(date +%s.%N)
	python3 -c "
n, hz = $N, $HZ
a, e, w = ($a1 - $a0) * 1000 / hz / n, ($e1 - $e0) * 1000 / hz / n, ($t1 - $t0) * 1000 / n
print('| $1 | %.1f | %.1f | %.1f | %s |' % (a, e, w, '$codes'.strip(', ')))
open('$W/figures.jsonl', 'a').write('{\"write\": \"$6\", \"apiserver_cpu_ms\": %.3f, \"etcd_cpu_ms\": %.3f, \"wall_ms\": %.3f}\\n' % (a, e, w))"
}
API=$GPUNODE_API_URL
REPORT=$API/apis/gpunode.dev/v1alpha1/gpunodereports/$NODE
echo "$N requests of each kind, sequential, one connection; CPU ms per request (kube-apiserver $("$GPUNODE_KUBE_APISERVER" --version | cut -d' ' -f2), $(nproc) cores)."
echo
echo "| write | kube-apiserver CPU ms | etcd CPU ms | wall ms | HTTP codes |"
echo "|---|---:|---:|---:|---|"
measure "report status, server-side apply (a report heartbeat)" "$REPORT/status?fieldManager=gpunode-node-probe&force=true" PATCH application/apply-patch+yaml "$W/ssa-" report_apply
measure "report status, merge patch of observedAt only" "$REPORT/status?fieldManager=bench" PATCH application/merge-patch+json "$W/merge-" report_merge
measure "heartbeat Lease, server-side apply (what the probe writes now)" "$API/apis/coordination.k8s.io/v1/namespaces/gpunode-system/leases/gpunode-probe-$NODE?fieldManager=gpunode-node-probe&force=true" PATCH application/apply-patch+yaml "$W/lease-" lease_apply
measure "Node label, merge patch" "$API/api/v1/nodes/$NODE?fieldManager=bench" PATCH application/merge-patch+json "$W/label-" node_label_merge
measure "Node status, server-side apply (gpunode records a node)" "$API/api/v1/nodes/$NODE/status?fieldManager=gpunode-operator&force=true" PATCH application/apply-patch+yaml "$W/record-" node_record_apply
measure "report, get" "$REPORT" GET "" "" report_get
if [[ -n ${WRITE_COST_JSON:-} ]]; then
	python3 - "$W/figures.jsonl" "$N" "$("$GPUNODE_KUBE_APISERVER" --version | cut -d' ' -f2)" "$(git rev-parse --short=12 HEAD)" >"$WRITE_COST_JSON" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(json.dumps({"requests_each": int(sys.argv[2]), "kube_apiserver": sys.argv[3], "commit": sys.argv[4],
                  "writes": {r.pop("write"): r for r in rows}}, indent=2))
PY
fi
