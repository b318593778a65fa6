#!/usr/bin/env bash
# The scale benchmark (`make bench`; issue 8). For each N: a fresh local control plane
# (GPUNODE_SCALE=1: inflight limits 5000), N KWOK GPU nodes, the load generator (the probe's
# publisher, one loop per node), gpunode-operator as a release-built process with the chart's
# ServiceAccount and RBAC, a plain concurrent client for the reference write rate, and
# nfd-master as the peer. Results: docs/benchmarks/results.{json,md}, scale.png, raw/. Each N's
# work files stay in .cluster/<cluster>-work/n<N>/: the operator's log, metrics and RSS/CPU
# samples, the real probes' logs (real-probes/) and the control plane's (control-plane/).
#
# Usage:  bench/run.sh                       (make bench)
# Environment (defaults in brackets):
#   BENCH_NS            node counts, comma-separated [100,1000,5000]
#   BENCH_CLUSTER       cluster name under .cluster/ [bench]; stopped and purged after each N
#   BENCH_RESULTS       output directory [docs/benchmarks]; runs of other N already in its raw/
#                       are kept, so N values can be measured in separate invocations
#   BENCH_CHANGES       single faults per repetition of the reaction phases [200]
#   BENCH_BURSTS        bursts per repetition [3], of BENCH_BURST_SIZE nodes at once [256]
#   BENCH_RATES         open-loop fault rates per second, up to the first not sustained
#                       [5,10,20,50,100,200], each for BENCH_RATE_SECS [10]
#   BENCH_REACTION_REPS repetitions of the reaction phases, gpunode's and the floor's (the minimal
#                       controller of bench/src/floor.rs) alternating which goes first [3]
#   BENCH_STEADY_S      steady-state window [120]
#   BENCH_REAL_PROBES   nodes published by real gpunode-probe processes (the rest by the load
#                       generator) [16];  BENCH_REAL_ROUNDS: XIDs injected per real probe [16]
#   BENCH_REPS          repetitions of the reference write rate's sweep and of gpunode's convergence,
#                       interleaved [5]
#   BENCH_CONCURRENCY   requests in flight the reference rate is swept over [8,16,32,64,128,256,512]
#   BENCH_STAGGER_S     spread of the probes' start-up [60]; longer eases the API server at 5,000
#   BENCH_WRITE_COST=0  skip bench/write-cost.sh (the cost model then uses raw/write-cost.json as is)
#   BENCH_NFD=0         skip the peer;  BENCH_NFD_DEADLINE_S: NFD's wait before projecting [300]
#   BENCH_PEER_REPS     repetitions of the comparison with NFD, gpunode's convergence and NFD's
#                       settings alternating which goes first [3]
#   BENCH_NFD_PARALLELISM  NFD's -nfd-api-parallelism values swept without a client limit,
#                       besides its defaults [10,32,128,512]
#   BENCH_LEASE_SECONDS kwok node lease duration [240] (kubelet's 40 s renews every 10 s:
#                       500 writes/s at 5,000 nodes, which alone saturates a 2-core API server;
#                       KCM's node-monitor grace period is set to twice this)
#   BENCH_PERF=1        record a perf profile of the operator (reaction + steady phases)
#   BENCH_KEEP=1        leave the last cluster running
#   BENCH_WORKTREE=1    measure the work tree as it is instead of a snapshot of HEAD
#   CARGO_TARGET_DIR    cargo's target directory [target]
set -euo pipefail
PROG=bench/run.sh
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

IFS=, read -r -a NS <<<"${BENCH_NS:-100,1000,5000}"
for n in "${NS[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "BENCH_NS must be positive numbers (got '$n')"; done
NAME=${BENCH_CLUSTER:-bench}
RESULTS=${BENCH_RESULTS:-$REPO/docs/benchmarks}
RESULTS=$(mkdir -p "$RESULTS" && cd "$RESULTS" && pwd)
LEASE=${BENCH_LEASE_SECONDS:-240}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
CACHE=${GPUNODE_CACHE:-$HOME/.cache/gpunode}
D=$REPO/.cluster/$NAME
WORK=$REPO/.cluster/$NAME-work
mkdir -p "$WORK" "$RESULTS/raw"
cd "$REPO"

log "building: control plane (cached), nfd-master (cached), gpunode-operator and gpunode-bench (release)"
e2e/cluster/build.sh
eval "$(e2e/cluster/build.sh --print-env)"
NFD_ARGS=()
if [[ ${BENCH_NFD:-1} != 0 ]]; then
	mapfile -t nfd < <(bench/nfd-build.sh)
	NFD_ARGS=(--nfd-master "${nfd[0]}" --nfd-crds "${nfd[1]}/deployment/base/nfd-crds/nfd-api-crds.yaml"
		--nfd-deadline-s "${BENCH_NFD_DEADLINE_S:-300}" --peer-reps "${BENCH_PEER_REPS:-3}"
		--nfd-parallelism "${BENCH_NFD_PARALLELISM:-10,32,128,512}")
fi
# The binaries measured are built from a snapshot of HEAD (git archive), so the results belong to
# a commit even while the work tree has uncommitted edits; BENCH_WORKTREE=1 builds the work tree.
SRC=$REPO
if [[ ${BENCH_WORKTREE:-0} != 1 ]]; then
	BENCH_COMMIT=$(git rev-parse --short=12 HEAD)
	export BENCH_COMMIT
	SRC=$WORK/src-$BENCH_COMMIT
	if [[ ! -f $SRC/Cargo.toml ]]; then
		rm -rf "$WORK"/src-*
		mkdir -p "$SRC"
		git archive HEAD | tar -x -C "$SRC"
	fi
fi
# The real probes (end-to-end reaction, probe cost) run the release probe and fake NVML library
# that sit beside the bench binary.
(cd "$SRC" && CARGO_TARGET_DIR=$TARGET cargo build --release --locked -p gpunode-operator -p gpunode-bench \
	-p gpunode-probe -p fake-nvml)
OPERATOR=$TARGET/release/gpunode-operator
BENCH=$TARGET/release/gpunode-bench

"$BENCH" machine --binary "kube-apiserver=$GPUNODE_KUBE_APISERVER:--version" \
	--binary "etcd=$GPUNODE_ETCD:--version" --binary "kwok=$GPUNODE_KWOK:--version" \
	--binary "gpunode-operator=$OPERATOR:--version" \
	${nfd:+--binary "nfd-master=${nfd[0]}:-version"} >"$RESULTS/raw/machine.json"
log "machine:"
cat "$RESULTS/raw/machine.json" >&2

# What one write costs the API server (the cost model's per-write figures), on its own cluster.
if [[ ${BENCH_WRITE_COST:-1} != 0 ]]; then
	log "write cost: bench/write-cost.sh 500"
	WRITE_COST_JSON=$RESULTS/raw/write-cost.json bench/write-cost.sh 500 >"$RESULTS/raw/write-cost.md"
fi

for N in "${NS[@]}"; do
	log "==== N = $N ===="
	e2e/cluster/down.sh "$NAME" --purge >/dev/null 2>&1 || true
	rm -f "$D/logs/audit.log"
	mkdir -p "$D/logs"
	kubeconfig=$(GPUNODE_SCALE=1 \
		GPUNODE_APISERVER_ARGS="--audit-policy-file=$REPO/bench/audit-policy.yaml --audit-log-path=$D/logs/audit.log --audit-log-maxsize=0 --audit-log-maxbackup=0" \
		GPUNODE_KWOK_ARGS="--node-lease-duration-seconds=$LEASE" \
		GPUNODE_KCM_ARGS="--node-monitor-grace-period=$((LEASE * 2))s" \
		e2e/cluster/up.sh "$NAME" | tail -1)
	export KUBECONFIG=$kubeconfig
	t0=$SECONDS
	NODE_WAIT_TIMEOUT=$((300 + N / 5)) e2e/cluster/nodes.sh "$N" >/dev/null
	log "$N nodes Ready in $((SECONDS - t0)) s"
	# The chart's operator ServiceAccount and ClusterRole: the operator runs with exactly them.
	"$GPUNODE_KUBECTL" create namespace gpunode-system --dry-run=client -o yaml |
		"$GPUNODE_KUBECTL" apply --server-side -f - >/dev/null
	"$GPUNODE_HELM" template gpunode charts/gpunode --namespace gpunode-system \
		--show-only templates/serviceaccounts.yaml --show-only templates/rbac-operator.yaml |
		"$GPUNODE_KUBECTL" apply --server-side -f - >/dev/null
	out=$WORK/n$N
	rm -rf "$out"
	perf=()
	[[ ${BENCH_PERF:-0} == 1 ]] && perf=(--perf)
	"$BENCH" run --nodes "$N" --kubeconfig "$kubeconfig" --audit-log "$D/logs/audit.log" \
		--operator "$OPERATOR" --out "$out" --changes "${BENCH_CHANGES:-200}" \
		--bursts "${BENCH_BURSTS:-3}" --burst-size "${BENCH_BURST_SIZE:-256}" --rates "${BENCH_RATES:-5,10,20,50,100,200}" \
		--rate-secs "${BENCH_RATE_SECS:-10}" --reaction-reps "${BENCH_REACTION_REPS:-3}" --steady-s "${BENCH_STEADY_S:-120}" \
		--reps "${BENCH_REPS:-5}" --real-probes "${BENCH_REAL_PROBES:-16}" --real-rounds "${BENCH_REAL_ROUNDS:-16}" --concurrency "${BENCH_CONCURRENCY:-8,16,32,64,128,256,512}" --stagger-s "${BENCH_STAGGER_S:-60}" "${NFD_ARGS[@]}" "${perf[@]}" >/dev/null
	cp "$out/n$N.json" "$RESULTS/raw/"
	if [[ -f $out/perf-$N.data ]]; then
		perf report -i "$out/perf-$N.data" --stdio --no-children --sort symbol 2>/dev/null |
			grep -v '^#' | grep -v '^$' | head -n 60 >"$RESULTS/raw/perf-$N.txt" || true
	fi
	log "N = $N done: $(tr -d '\n ' <"$out/n$N.json" | head -c 300)..."
	# The control plane's logs stay beside the run's work files ($out/control-plane), to explain
	# a tail in the results after the cluster is purged (not the audit log: read already, and
	# gigabytes at 5,000 nodes).
	mkdir -p "$out/control-plane"
	find "$D/logs" -maxdepth 1 -name '*.log' ! -name audit.log -exec cp {} "$out/control-plane/" \; 2>/dev/null || true
	[[ ${BENCH_KEEP:-0} == 1 && $N == "${NS[-1]}" ]] || e2e/cluster/down.sh "$NAME" --purge >/dev/null 2>&1 || true
done

"$BENCH" report --results "$RESULTS/raw" --out "$RESULTS"
# The chart: matplotlib in a venv under the cache (keeps plotting out of CI and the workspace).
VENV=$CACHE/venv
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
	log "creating $VENV with matplotlib (PyPI)"
	python3 -m venv "$VENV"
	"$VENV/bin/pip" install --quiet 'matplotlib==3.10.*'
fi
"$VENV/bin/python" bench/plot.py "$RESULTS/results.json" "$RESULTS/raw" "$RESULTS/scale.png"
log "results: $RESULTS/results.md, results.json, scale.png"
cat "$RESULTS/results.md"
