#!/usr/bin/env bash
# Observation -> stored report, per check class: one node-probe (release build, fake NVML, fixture
# sysfs tree) publishing to a local control plane with examples/h100-training.yaml applied, so it
# publishes by the operator's own checks. For each class the fixture is switched from healthy to
# a drifted one; the probe's log gives when the observation that saw it finished ("observed")
# and when the API server acknowledged the report ("published"). Both are printed, with the
# time from the switch (which adds up to one collection interval, --interval 2s here).
#
# Usage:  node-probe/benches/latency.sh [ROUNDS]   (default 3 rounds of every class)
set -euo pipefail
ROUNDS=${1:-3}
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 ]] || { echo "latency.sh: ROUNDS must be a number >= 1" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
echo "latency: building the release probe and fake NVML" >&2
cargo build --release --locked -p gpunode-probe -p fake-nvml >&2
BIN=$CARGO_TARGET_DIR/release
export KUBECONFIG
KUBECONFIG=$(GPUNODE_CLUSTER_NAME=bench-latency e2e/cluster/up.sh | tail -1)
trap 'kill "${PID:-0}" 2>/dev/null || true; GPUNODE_CLUSTER_NAME=bench-latency e2e/cluster/down.sh >/dev/null 2>&1 || true' EXIT
NODE=$(e2e/cluster/nodes.sh 1 latency | tail -1)
kubectl apply --server-side -f charts/gpunode/crds >/dev/null
kubectl create namespace gpunode-system --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
kubectl apply --server-side -f examples/h100-training.yaml >/dev/null

WORK=$(mktemp -d)
FX=node-probe/fake-nvml/fixtures
TREES=node-probe/tests/fixtures/sysfs
# A hot GPU: 86 C against maxGpuCelsius 85, every other value healthy.
python3 - "$FX/healthy-8xh100.json" "$WORK/hot-86c.json" <<'EOF'
import json, sys
fx = json.load(open(sys.argv[1]))
fx["devices"][0]["temperature"] = 86
json.dump(fx, open(sys.argv[2], "w"))
EOF
nvml() { ln -sfn "$1" "$WORK/nvml.json"; }
tree() { ln -sfn "$ROOT/$TREES/$1" "$WORK/tree"; }
nvml "$ROOT/$FX/healthy-8xh100.json"
tree lossless-8port
LOG=$WORK/probe.log
# Recoveries are written at once here (--recovery-gap 1s), so each case starts from a published
# healthy report.
FAKE_NVML_FIXTURE=$WORK/nvml.json RUST_LOG=gpunode_probe=debug NO_COLOR=1 "$BIN/gpunode-probe" \
	--node-name "$NODE" --nvml-lib "$BIN/libfake_nvml.so" --sysfs-root "$WORK/tree/sys" \
	--net-fixtures "$WORK/tree" --interval 2s --recovery-gap 1s --metrics-addr 127.0.0.1:0 >"$LOG" 2>&1 &
PID=$!

published() { grep -c ' published' "$LOG" || true; }
# wait_published N: until the log has more than N "published" lines (poll 0.1 s, deadline 60 s).
wait_published() {
	local n=$1
	for _ in $(seq 600); do
		(($(published) > n)) && return 0
		sleep 0.1
	done
	echo "latency: no report published within 60 s" >&2
	tail -20 "$LOG" >&2
	return 1
}
wait_published 0

CASES=(
	"Throttle nvml throttled.json"
	"Thermal nvml HOT"
	"Memory nvml row-remap-failure.json"
	"Xid nvml ecc-xid79.json"
	"Pcie nvml pcie-gen4-x8.json"
	"Nvlink nvml nvlink-two-down.json"
	"Driver nvml old-driver.json"
	"Network tree pfc-wrong-priority"
	"Network tree mtu-1500"
	"Network tree one-port-down"
)
: >"$WORK/marks"
for round in $(seq "$ROUNDS"); do
	for c in "${CASES[@]}"; do
		read -r class kind what <<<"$c"
		# The probe writes its report at most once a second (its XID-storm bound): a
		# change in the second after the last write waits for it by design. Switch on a quiet probe.
		sleep 1.1
		n=$(published)
		if [[ $kind == nvml ]]; then
			[[ $what == HOT ]] && nvml "$WORK/hot-86c.json" || nvml "$ROOT/$FX/$what"
		else
			tree "$what"
		fi
		echo "$class $what $(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) $n" >>"$WORK/marks"
		wait_published "$n"
		# Back to healthy, and wait for that report too.
		n=$(published)
		nvml "$ROOT/$FX/healthy-8xh100.json"
		tree lossless-8port
		wait_published "$n"
	done
	echo "latency: round $round done" >&2
done

python3 - "$LOG" "$WORK/marks" <<'EOF'
import re, statistics, sys
from datetime import datetime
ansi = re.compile(r"\x1b\[[0-9;]*m")
ts = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))
lines = [ansi.sub("", l) for l in open(sys.argv[1])]
events = []  # (time, kind)
for l in lines:
    m = re.match(r"(\S+Z)\s", l)
    if not m:
        continue
    if " observed" in l:
        events.append((ts(m.group(1)), "observed"))
    elif " published" in l:
        events.append((ts(m.group(1)), "published"))
rows = {}
for mark in open(sys.argv[2]):
    cls, what, at, n = mark.split()
    at, n = ts(at), int(n)
    pubs = [i for i, e in enumerate(events) if e[1] == "published"]
    i = pubs[n]  # the first report published after the switch
    obs = next(events[j][0] for j in range(i, -1, -1) if events[j][1] == "observed")
    pub = events[i][0]
    rows.setdefault(f"{cls} ({what})", []).append(((pub - obs).total_seconds() * 1000, (pub - at).total_seconds() * 1000))
print("| class (fixture) | observation -> report ms, median (max) | switch -> report ms, median (max) |")
print("|---|---:|---:|")
for k, v in rows.items():
    o = [x[0] for x in v]; s = [x[1] for x in v]
    print(f"| {k} | {statistics.median(o):.0f} ({max(o):.0f}) | {statistics.median(s):.0f} ({max(s):.0f}) |")
EOF
