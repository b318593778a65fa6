#!/usr/bin/env bash
# `make demo`: gpunode at work on a local control plane with fake GPU nodes.
#
# Builds everything (the first run builds the control plane from the Go module proxy: ~20 min on
# two cores, cached in ~/.cache/gpunode), starts the local control plane `.cluster/demo`, installs
# the Helm chart, creates 29 KWOK nodes in three pools and a system node for the operator's pods:
# - 20 H100 SXM nodes (examples/h100-training.yaml): 17 healthy, one thermally throttled, one with
#   PFC on the wrong priority, one with an uncorrectable ECC error and XID 79;
# - 7 H200 nodes (examples/h200-training.yaml): 5 healthy, one throttled (it waits for the
#   maintenance window), one with a pending row remap (drained at once, then repaired by a GPU
#   reset that its gpu-reset pod performs, the chart's reset DaemonSet on H200 nodes only);
# - 1 H100 NVL node (examples/h100-nvl-per-gpu.yaml) whose GPUs are DRA devices: one GPU takes
#   XID 79 and is quarantined alone.
# It runs a node-probe per GPU node against the fake NVML library and fixture sysfs trees, and the
# operator (two replicas, leader election), each as a local process with a token of the chart's
# ServiceAccount bound to its pod, so the chart's RBAC and admission policy are what the demo runs
# under. A training Deployment with a PodDisruptionBudget sits on the H100 node that will fail; an
# inference Deployment holds the NVL node's eight GPUs. Then it applies examples/ and shows what
# happens until the end state is reached.
#
# Environment: DEMO_TIMEOUT (seconds to reach the end state, default 300), GPUNODE_CACHE,
# GPUNODE_DEMO_CLUSTER and GPUNODE_DEMO_METRICS_PORT (see lib.sh; `make test` runs the demo with
# both set, e2e/tests/demo.rs). On a terminal the live view is redrawn in place; otherwise (a log,
# CI) each screen is printed once, when it changes.
# Stop it with `make demo-down`; explore it with e2e/demo/ctl.sh (printed at the end).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source e2e/demo/lib.sh
TIMEOUT=${DEMO_TIMEOUT:-300}
STEPS=8

step 1 "Building the local control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok, helm"
note "(first run on a fresh machine: about 20 minutes on two cores, with progress every 30 s; cached afterwards)"
e2e/cluster/build.sh
eval "$(e2e/cluster/build.sh --print-env)"
HELM=$GPUNODE_HELM
KUBECTL=${GPUNODE_KUBECTL:-kubectl}

step 2 "Building gpunode: the operator, the node-probe, kubectl-gpunode and the fake NVML library (cargo build)"
# With the features the workspace build of `make test` has (the reliability suite's crash
# points, inert unless a test arms one): the demo's build and the tests' then make the same
# binaries, and neither replaces the other's with a different one.
cargo build --locked -p gpunode-operator -p gpunode-probe -p fake-nvml -p kubectl-gpunode \
	--features gpunode-operator/failpoints,gpunode-probe/failpoints 2>&1 |
	grep -v '^\s*Compiling' >&2 || true
for b in gpunode-operator gpunode-probe libfake_nvml.so kubectl-gpunode; do
	[[ -e $BIN/$b ]] || die "cargo build did not produce $BIN/$b"
done

step 3 "Starting the local control plane (.cluster/$DEMO_CLUSTER)"
demo_stop_processes
GPUNODE_CLUSTER_NAME=$DEMO_CLUSTER e2e/cluster/down.sh --purge >/dev/null 2>&1 || true
# A fresh start: no fake GPU keeps the resets, and no probe the XIDs, of an earlier run.
rm -rf "$WORK"
KUBECONFIG=$(GPUNODE_CLUSTER_NAME=$DEMO_CLUSTER e2e/cluster/up.sh | tail -1)
export KUBECONFIG
mkdir -p "$WORK" "$LOGS"
echo "$KUBECONFIG" >"$WORK/kubeconfig-path"

step 4 "Creating the first KWOK nodes: $SYSTEM_NODE (for the operator's pods), $XID and $NVL"
make_node "$SYSTEM_NODE" system
make_node "$XID" gpu
make_node "$NVL" nvl
# What NVIDIA's DRA driver would publish for the NVL node: its eight GPUs as devices.
publish_slice "$NVL" healthy-8xh100nvl.json
"$KUBECTL" wait --for=condition=Ready node --all --timeout=120s >/dev/null

step 5 "Installing the gpunode Helm chart (namespace $NS)"
# What the NVIDIA GPU Operator would have created; the chart's probe pods ask for it.
"$KUBECTL" apply --server-side -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
EOF
# The H200 pool's validation Jobs run in gpu-validation; its repair ladder resets GPUs through
# the reset DaemonSet (nodeProbe.gpuReset.enabled), on the H200 nodes only (they opt in).
"$KUBECTL" create namespace gpu-validation >/dev/null
"$HELM" install gpunode charts/gpunode --namespace "$NS" --create-namespace \
	--set-string "operator.nodeSelector.gpunode\.dev/demo-role=system" \
	--set nodeProbe.gpuReset.enabled=true --set-string "nodeProbe.gpuReset.nodeSelector.gpunode\.dev/demo-role=h200" \
	--set "operator.validation.namespaces={gpu-validation}" \
	>"$LOGS/helm-install.log"
sed -n '/^NOTES:/,$p' "$LOGS/helm-install.log" >&2
wait_for "two operator pods" 120 operator_pods_running

step 6 "A training job protected by a PodDisruptionBudget (maxUnavailable 1) on $XID; an inference service on $NVL's 8 GPUs"
# While $XID is the only H100 SXM node, all three replicas land on it; the replacements that its
# drain causes go to the healthy nodes created next.
"$KUBECTL" apply --server-side -f e2e/demo/workload.yaml >/dev/null
"$KUBECTL" apply --server-side -f e2e/demo/inference.yaml >/dev/null
wait_for "3 trainer pods running on $XID" 120 trainers_on_xid_running
wait_for "8 inference pods running on $NVL, one GPU each" 120 inference_on_nvl_running

step 7 "Starting ${#GPU_NODES[@]} GPU nodes, one node-probe each (fake NVML + fixture sysfs), and the operator (2 replicas)"
for n in "${HEALTHY[@]}" "$HOT" "$ROCE"; do make_node "$n" gpu; done
for n in "${H200_HEALTHY[@]}" "$H200_HOT" "$H200_REMAP"; do make_node "$n" h200; done
"$KUBECTL" wait --for=condition=Ready node --all --timeout=120s >/dev/null
wait_for "the probe DaemonSet's pod on each GPU node" 120 probe_pods_running
wait_for "the reset DaemonSet's pod on each H200 node" 120 reset_pods_running
for n in "${HEALTHY[@]}"; do start_probe "$n" healthy-8xh100.json lossless-8port; done
start_probe "$HOT" throttled.json lossless-8port
start_probe "$ROCE" healthy-8xh100.json pfc-wrong-priority
start_probe "$XID" healthy-8xh100.json lossless-8port
for n in "${H200_HEALTHY[@]}"; do start_probe "$n" healthy-8xh200.json lossless-8port --follow-resets; done
start_probe "$H200_HOT" h200-throttled.json lossless-8port --follow-resets
start_probe "$H200_REMAP" h200-remap-pending.json lossless-8port --follow-resets
for n in "${RESET_NODES[@]}"; do start_reset "$n"; done
start_probe "$NVL" healthy-8xh100nvl.json lossless-8port
start_operators
wait_for "a GpuNodeReport from every GPU node" 120 all_reports_published
# NVML delivers an XID only to a probe that was listening when it happened: once $XID's probe is,
# its GPU takes an uncorrectable ECC error and falls off the bus (XID 79); so does GPU
# $NVL_BAD_GPU of $NVL.
wait_for "$XID's probe listening for XID events" 60 probe_listening "$XID"
ln -sfn "$NVML_FIXTURES/ecc-xid79.json" "$WORK/nodes/$XID/nvml.json"
wait_for "$NVL's probe listening for XID events" 60 probe_listening "$NVL"
ln -sfn "$NVML_FIXTURES/h100nvl-ecc-xid79.json" "$WORK/nodes/$NVL/nvml.json"

step 8 "Applying examples/ ($(example_names))"
# Each example selects its own pool (tests/examples.rs in the operator proves they coexist); the
# demo's 20 nodes are the H100 training pool of examples/h100-training.yaml.
"$KUBECTL" apply -f examples/
# h200-training waits for a weekend-night window in Europe/Berlin; so that the demo shows the same
# at any hour, its window moves to one that opens 12 hours from now (UTC).
close_h200_window
note "watching until: $HOT tainted, $XID cordoned and drained within the PDB, $ROCE drifted;"
note "  $H200_HOT waiting for the window, $H200_REMAP drained and its GPU $H200_BAD_GPU reset by its gpu-reset pod;"
note "  GPU $NVL_BAD_GPU of $NVL quarantined alone, 7 inference pods still on $NVL; the rest compliant"
START=$(date +%s)
while true; do
	show_screen
	if end_state_reached; then
		# The final screen, drawn after the end state was seen, so it shows it.
		show_screen final
		break
	fi
	if (($(date +%s) - START > TIMEOUT)); then
		echo >&2
		die "the end state was not reached within ${TIMEOUT}s; logs: $LOGS (operator-*.log, probe-*.log)"
	fi
	next_change
done
echo
printf '\033[1mEnd state reached in %ss after applying examples/.\033[0m\n' "$(($(date +%s) - START))"
printf '\nWhat kubectl gpunode says (%s):\n\n' "$BIN/kubectl-gpunode"
NO_COLOR=1 plugin_views
explore_help
