#!/usr/bin/env bash
# Steady-state cost of one node-probe at its default intervals (10 s collection, 60 s heartbeat),
# publishing to a local control plane: CPU as a share of one core, peak RSS, API writes per hour.
#
# Usage:  node-probe/benches/soak.sh [SECONDS]        (default 600; `make bench-probe`)
#         NOISE=1 node-probe/benches/soak.sh [SECONDS]
# NOISE=1: a GpuNodePolicy (examples/h100-training.yaml) is applied, so the probe publishes by
# the operator's checks, and the fake NVML fixture is rewritten every 2 s with realistic noise:
# GPU temperatures around means of 55-80 C (sd 1 C), HBM 6 C above, power 250-700 W.
# The probe is the release build, with the fake NVML library (healthy 8x H100 fixture) and the
# lossless 8-port sysfs fixture tree. Targets (issue 4): CPU < 0.5% of one core, RSS < 30 MB,
# at most 60 writes per node per hour.
set -euo pipefail
DURATION=${1:-600}
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 30 ]] || { echo "soak.sh: SECONDS must be a number >= 30" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

echo "soak: building the release probe and fake NVML" >&2
cargo build --release --locked -p gpunode-probe -p fake-nvml >&2
BIN=$CARGO_TARGET_DIR/release
export KUBECONFIG
KUBECONFIG=$(GPUNODE_CLUSTER_NAME=bench-probe e2e/cluster/up.sh | tail -1)
trap 'kill "${PID:-0}" "${NOISE_PID:-0}" 2>/dev/null || true; GPUNODE_CLUSTER_NAME=bench-probe e2e/cluster/down.sh >/dev/null 2>&1 || true' EXIT
NODE=$(e2e/cluster/nodes.sh 1 soak | tail -1)
kubectl apply --server-side -f charts/gpunode/crds >/dev/null
# The release namespace, so the probe heartbeats through its Lease as in a real install
# (without it every heartbeat is a whole report write).
kubectl create namespace gpunode-system --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null

WORK=$(mktemp -d)
cp node-probe/fake-nvml/fixtures/healthy-8xh100.json "$WORK/nvml.json"
if [[ ${NOISE:-0} == 1 ]]; then
	kubectl apply --server-side -f examples/h100-training.yaml >/dev/null
	python3 - "$WORK/nvml.json" <<'EOF' &
import json, os, random, sys, time
path = sys.argv[1]
base = json.load(open(path))
means = [55 + 25 * i / 7 for i in range(8)]
while True:
    fx = json.loads(json.dumps(base))
    for d, m in zip(fx["devices"], means):
        d["temperature"] = round(random.gauss(m, 1.0))
        d["memory_temperature"] = round(random.gauss(m + 6, 1.0))
        d["power_mw"] = random.randint(250, 700) * 1000
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(fx, f)
    os.rename(tmp, path)
    time.sleep(2)
EOF
	NOISE_PID=$!
fi
TREE=node-probe/tests/fixtures/sysfs/lossless-8port
FAKE_NVML_FIXTURE=$WORK/nvml.json "$BIN/gpunode-probe" --node-name "$NODE" \
	--nvml-lib "$BIN/libfake_nvml.so" --sysfs-root "$TREE/sys" --net-fixtures "$TREE" \
	--metrics-addr 127.0.0.1:0 >"$WORK/probe.log" 2>&1 &
PID=$!

ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
# Warm-up: the first collection and publish are start-up cost, not steady state. Poll interval
# 0.2 s, deadline 60 s.
for _ in $(seq 300); do
	kubectl get gnr "$NODE" >/dev/null 2>&1 && break
	sleep 0.2
done
kubectl get gnr "$NODE" >/dev/null || { cat "$WORK/probe.log" >&2; exit 1; }
# Writes the API server served for reports: this cluster has no other writer of gpunodereports.
writes() { kubectl get --raw /metrics |
	awk '/^apiserver_request_total\{/ && /resource="gpunodereports"/ && /verb="(PATCH|APPLY|PUT|POST)"/ {s += $NF} END {print s + 0}'; }
T0=$(date +%s.%N) C0=$(ticks) W0=$(writes)
echo "soak: measuring ${DURATION}s (probe pid $PID)" >&2
# The measurement window itself: a fixed-length observation, not a wait for a condition.
sleep "$DURATION"
T1=$(date +%s.%N) C1=$(ticks) W1=$(writes)
HZ=$(getconf CLK_TCK)
HWM=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status")
python3 - "$T0" "$T1" "$C0" "$C1" "$HZ" "$HWM" "$W0" "$W1" <<'EOF'
import sys
t0, t1, c0, c1, hz, hwm, w0, w1 = map(float, sys.argv[1:])
secs = t1 - t0
cpu = (c1 - c0) / hz
print(f"machine: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
print(f"window: {secs:.0f} s")
print(f"cpu: {cpu:.2f} s = {100 * cpu / secs:.3f}% of one core (target < 0.5%)")
print(f"peak rss: {hwm / 1024:.1f} MiB (target < 30)")
print(f"report writes: {w1 - w0:.0f} = {(w1 - w0) * 3600 / secs:.0f} per hour (target <= 60)")
EOF
