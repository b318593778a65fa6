# Shared by e2e/demo/{demo,ctl,down}.sh: names, paths and the small steps of the demo.
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this file
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# GPUNODE_DEMO_CLUSTER names the demo's control plane (.cluster/NAME, default demo): `make test`
# runs the demo under another name, so it never stops a demo someone is exploring.
DEMO_CLUSTER=${GPUNODE_DEMO_CLUSTER:-demo}
[[ $DEMO_CLUSTER =~ ^[a-z0-9][a-z0-9-]*$ ]] || {
	echo "demo: GPUNODE_DEMO_CLUSTER must be lower-case letters, digits and '-', not '$DEMO_CLUSTER'" >&2
	exit 2
}
CLUSTER_DIR=$ROOT/.cluster/$DEMO_CLUSTER
# The operators' /metrics ports: this one and the next (GPUNODE_DEMO_METRICS_PORT, default 18080).
METRICS_PORT=${GPUNODE_DEMO_METRICS_PORT:-18080}
WORK=$CLUSTER_DIR/demo
LOGS=$WORK/logs
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug
NS=gpunode-system
NVML_FIXTURES=$ROOT/node-probe/fake-nvml/fixtures
SYSFS_FIXTURES=$ROOT/node-probe/tests/fixtures/sysfs
KUBECTL=${KUBECTL:-kubectl}

SYSTEM_NODE=system-0
# The H100 SXM training pool (examples/h100-training.yaml).
HOT=h100-hot
ROCE=h100-roce
XID=h100-xid
HEALTHY=()
for i in $(seq -w 0 16); do HEALTHY+=("h100-0$i"); done
# The H200 pool (examples/h200-training.yaml): a maintenance window, a repair ladder.
H200_HOT=h200-hot
H200_REMAP=h200-remap
H200_HEALTHY=()
for i in $(seq 0 4); do H200_HEALTHY+=("h200-00$i"); done
# The H100 NVL node of examples/h100-nvl-per-gpu.yaml: one GPU quarantined at a time (DRA).
NVL=h100-nvl
# The GPU of $NVL that fails (the fixture's XID), and the one of $H200_REMAP that its gpu-reset pod resets.
NVL_BAD_GPU=5
H200_BAD_GPU=3
GPU_NODES=("${HEALTHY[@]}" "$HOT" "$ROCE" "$XID" "${H200_HEALTHY[@]}" "$H200_HOT" "$H200_REMAP" "$NVL")
# The nodes that opt in to GPU resets (the chart's nodeProbe.gpuReset.nodeSelector selects
# gpunode.dev/demo-role=h200): the reset DaemonSet runs there only.
RESET_NODES=("${H200_HEALTHY[@]}" "$H200_HOT" "$H200_REMAP")

die() {
	printf 'demo: %s\n' "$*" >&2
	exit 1
}
note() { printf '      %s\n' "$*" >&2; }
step() { printf '\n\033[1m[%s/%s] %s\033[0m\n' "$1" "${STEPS:-8}" "$2" >&2; }

# wait_for WHAT SECONDS COMMAND...: run COMMAND until it succeeds or SECONDS pass; on a timeout,
# print what the cluster shows (diagnose) before failing.
wait_for() {
	local what=$1 secs=$2 deadline
	shift 2
	deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		if (($(date +%s) >= deadline)); then
			diagnose >&2 || true
			die "timed out after ${secs}s waiting for $what"
		fi
		sleep 1 # poll interval
	done
}

# diagnose: the state a timed-out wait leaves behind: nodes, pods that are not running and the
# latest events of their namespaces, the scheduler's and KWOK's last words.
diagnose() {
	echo "demo: --- diagnostics ---"
	"$KUBECTL" get nodes -o wide 2>&1 | head -n 40
	"$KUBECTL" get pods -A -o wide --field-selector status.phase!=Running 2>&1 | head -n 40
	"$KUBECTL" get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 30
	local f
	for f in "$CLUSTER_DIR"/logs/kube-scheduler.log "$CLUSTER_DIR"/logs/kwok*.log; do
		[[ -e $f ]] || continue
		echo "demo: --- last lines of $f ---"
		tail -n 15 "$f"
	done
	echo "demo: --- end of diagnostics ---"
}

# make_node NAME ROLE: a KWOK node labelled gpunode.dev/demo-role=ROLE; ROLE gpu renders the fake
# H100 SXM node template, h200 an H200 node, nvl an H100 NVL node, system a plain node.
make_node() {
	local name=$1 role=$2 product memory
	case $role in
	gpu) product=NVIDIA-H100-80GB-HBM3 memory=81559 ;;
	h200) product=NVIDIA-H200 memory=143771 ;;
	nvl) product=NVIDIA-H100-NVL memory=95830 ;;
	system) ;;
	*) die "make_node: unknown role $role" ;;
	esac
	if [[ $role != system ]]; then
		sed -e "s/@NAME@/$name/g" -e "s/@PRODUCT@/$product/g" -e 's/@GPUS@/8/g' \
			-e "s/@GPU_MEMORY@/$memory/g" -e 's/@CPU@/32/g' -e 's/@MEMORY@/256Gi/g' -e 's/@PODS@/110/g' \
			"$ROOT/e2e/cluster/templates/fake-gpu-node.yaml"
	else
		sed -e "s/@NAME@/$name/g" -e 's/@PRODUCT@/none/g' -e 's/@GPUS@/0/g' -e 's/@GPU_MEMORY@/0/g' \
			-e 's/@CPU@/8/g' -e 's/@MEMORY@/32Gi/g' -e 's/@PODS@/110/g' \
			-e '/nvidia.com\/gpu/d' "$ROOT/e2e/cluster/templates/fake-gpu-node.yaml"
	fi | "$KUBECTL" apply --server-side --field-manager gpunode-demo -f - >/dev/null
	"$KUBECTL" label node "$name" --overwrite "gpunode.dev/demo-role=$role" >/dev/null
}

running_pods() { # NAMESPACE SELECTOR: running pods as "name node" lines
	"$KUBECTL" get pods -n "$1" -l "$2" --field-selector status.phase=Running \
		-o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}'
}

probe_pods_running() {
	(($(running_pods "$NS" app.kubernetes.io/component=node-probe | wc -l) == ${#GPU_NODES[@]}))
}
reset_pods_running() {
	(($(running_pods "$NS" app.kubernetes.io/component=gpu-reset | wc -l) == ${#RESET_NODES[@]}))
}
operator_pods_running() {
	(($(running_pods "$NS" app.kubernetes.io/component=operator | wc -l) == 2))
}

trainers_on() { running_pods training app=trainer | awk -v n="$1" '$2 == n' | wc -l; }
trainers_on_xid_running() { (($(trainers_on "$XID") == 3)); }
inference_on() { running_pods inference app=inference | awk -v n="$1" '$2 == n' | wc -l; }
inference_on_nvl_running() { (($(inference_on "$NVL") == 8)); }

# close_h200_window: h200-training's maintenance window becomes one hour that opens 12 hours from
# now (UTC), so the demo's H200 pool sees a closed window whatever the hour and day it runs.
close_h200_window() {
	local opens=$(($(date +%s) + 12 * 3600)) day start end
	day=$(date -u -d "@$opens" +%a)
	start=$(date -u -d "@$opens" +%H:%M)
	end=$(date -u -d "@$((opens + 3600))" +%H:%M)
	"$KUBECTL" patch gnp h200-training --type merge -p "{\"spec\":{\"maintenance\":{\"windows\":[{\"days\":[\"$day\"],\"start\":\"$start\",\"end\":\"$end\",\"timeZone\":\"UTC\"}]}}}" >/dev/null
}

# kubeconfig_for SERVICEACCOUNT POD FILE: a kubeconfig holding a token of the chart's ServiceAccount
# bound to POD, as the kubelet would mount it (the token carries the pod's node name).
kubeconfig_for() {
	local sa=$1 pod=$2 file=$3 server ca token
	server=$("$KUBECTL" config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
	ca=$WORK/ca.crt
	"$KUBECTL" config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' |
		base64 -d >"$ca"
	token=$("$KUBECTL" create token "$sa" -n "$NS" --bound-object-kind Pod --bound-object-name "$pod" --duration 24h)
	rm -f "$file"
	KUBECONFIG=$file "$KUBECTL" config set-cluster demo --server "$server" --certificate-authority "$ca" >/dev/null
	KUBECONFIG=$file "$KUBECTL" config set-credentials "$sa" --token "$token" >/dev/null
	KUBECONFIG=$file "$KUBECTL" config set-context demo --cluster demo --user "$sa" >/dev/null
	KUBECONFIG=$file "$KUBECTL" config use-context demo >/dev/null
	chmod 600 "$file"
}

# run_bg NAME ENV... -- COMMAND...: start COMMAND in its own session, logging to $LOGS/NAME.log.
run_bg() {
	local name=$1
	shift
	local envs=()
	while [[ $1 != -- ]]; do
		envs+=("$1")
		shift
	done
	shift
	mkdir -p "$WORK/pids"
	env "${envs[@]}" setsid "$@" </dev/null >"$LOGS/$name.log" 2>&1 &
	echo $! >"$WORK/pids/$name.pid"
}

# start_probe NODE NVML_FIXTURE SYSFS_TREE [ARG...]: the node's probe, with its fixtures behind
# symlinks that e2e/demo/ctl.sh swaps (the probe re-reads both on every collection), keeping the
# XIDs of this boot in $WORK/nodes/NODE/state (as the chart's /var/lib/gpunode); ARGs are passed on
# (--follow-resets: the probe follows the resets of start_reset's process, as the chart's probe
# does with nodeProbe.gpuReset.enabled).
start_probe() {
	local node=$1 dir=$WORK/nodes/$1 pod extra=("${@:4}")
	mkdir -p "$dir/state"
	ln -sfn "$NVML_FIXTURES/$2" "$dir/nvml.json"
	ln -sfn "$SYSFS_FIXTURES/$3" "$dir/tree"
	pod=$(running_pods "$NS" app.kubernetes.io/component=node-probe | awk -v n="$node" '$2 == n {print $1}')
	[[ -n $pod ]] || die "no node-probe pod on $node"
	kubeconfig_for gpunode-node-probe "$pod" "$dir/kubeconfig"
	run_bg "probe-$node" "KUBECONFIG=$dir/kubeconfig" "FAKE_NVML_FIXTURE=$dir/nvml.json" RUST_LOG=info -- \
		"$BIN/gpunode-probe" --node-name "$node" --nvml-lib "$BIN/libfake_nvml.so" \
		--sysfs-root "$dir/tree/sys" --net-fixtures "$dir/tree" --interval 2s --metrics-addr 127.0.0.1:0 \
		--state-dir "$dir/state" "${extra[@]}"
}

# start_reset NODE: the node's reset process (the chart's gpu-reset DaemonSet, --gpu-reset-only)
# under the reset ServiceAccount, with a token bound to the DaemonSet's pod on NODE; it answers
# the node's GpuResetRequests on the same fake GPUs as its probe (start_probe first).
start_reset() {
	local node=$1 dir=$WORK/nodes/$1 pod
	pod=$(running_pods "$NS" app.kubernetes.io/component=gpu-reset | awk -v n="$node" '$2 == n {print $1}')
	[[ -n $pod ]] || die "no gpu-reset pod on $node"
	kubeconfig_for gpunode-gpu-reset "$pod" "$dir/reset.kubeconfig"
	run_bg "reset-$node" "KUBECONFIG=$dir/reset.kubeconfig" "FAKE_NVML_FIXTURE=$dir/nvml.json" RUST_LOG=info -- \
		"$BIN/gpunode-probe" --gpu-reset-only --node-name "$node" --nvml-lib "$BIN/libfake_nvml.so"
}

# publish_slice NODE NVML_FIXTURE: what NVIDIA's DRA driver would publish for NODE, one device per
# GPU of the fixture (gpu-0..gpu-7) with the GPU's UUID, in a ResourceSlice of gpu.nvidia.com.
publish_slice() {
	local node=$1
	jq --arg node "$node" '{
		apiVersion: "resource.k8s.io/v1", kind: "ResourceSlice",
		metadata: {name: ($node + "-gpu.nvidia.com")},
		spec: {driver: "gpu.nvidia.com", nodeName: $node,
			pool: {name: $node, generation: 1, resourceSliceCount: 1},
			devices: [.devices | to_entries[] | {name: "gpu-\(.key)",
				attributes: {uuid: {string: .value.uuid}, index: {int: .key}}}]}
	}' "$NVML_FIXTURES/$2" | "$KUBECTL" apply --server-side --field-manager gpunode-demo -f - >/dev/null
}

# probe_listening NODE: the node's probe has registered for XID events. Like the real NVML, the
# fake library delivers only XIDs that happen after that, so an XID is injected only then.
probe_listening() { grep -q 'listening for XID events' "$LOGS/probe-$1.log"; }

start_operators() {
	local i=0 pod port bounds
	# What the chart grants validation Jobs and repair steps, as its Deployment passes it
	# (--validation-namespaces, --remediators).
	mapfile -t bounds < <("$KUBECTL" -n "$NS" get deployment -l app.kubernetes.io/component=operator \
		-o jsonpath='{.items[0].spec.template.spec.containers[0].args}' |
		jq -r '.[] | select(startswith("--validation-namespaces=") or startswith("--remediators="))')
	for pod in $(running_pods "$NS" app.kubernetes.io/component=operator | awk '{print $1}'); do
		kubeconfig_for gpunode-operator "$pod" "$WORK/operator-$i.kubeconfig"
		port=$((METRICS_PORT + i))
		run_bg "operator-$i" "KUBECONFIG=$WORK/operator-$i.kubeconfig" "POD_NAMESPACE=$NS" RUST_LOG=info -- \
			"$BIN/gpunode-operator" run --leader-elect=true --lease-namespace "$NS" --instance "$pod" \
			--metrics-addr "127.0.0.1:$port" "${bounds[@]}"
		echo "$port" >"$WORK/operator-$i.port"
		i=$((i + 1))
	done
}

all_reports_published() {
	(($("$KUBECTL" get gnr -o name | wc -l) == ${#GPU_NODES[@]}))
}

# demo_stop_processes: SIGTERM every process group the demo started (operators release their
# Lease, probes stop), wait until each group is gone, and SIGKILL what is left after
# GPUNODE_DEMO_STOP_TIMEOUT seconds (default 25: the operator bounds its own shutdown at 20 s).
# Runs before the control plane stops, so a graceful shutdown still has an API server to talk to.
demo_stop_processes() {
	local f pid deadline groups=() left
	[[ -d $WORK/pids ]] || return 0
	for f in "$WORK"/pids/*.pid; do
		[[ -e $f ]] || continue
		pid=$(cat "$f")
		rm -f "$f"
		[[ $pid =~ ^[0-9]+$ ]] || continue
		kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || continue
		groups+=("$pid")
	done
	deadline=$((SECONDS + ${GPUNODE_DEMO_STOP_TIMEOUT:-25}))
	while ((${#groups[@]})); do
		left=()
		for pid in "${groups[@]}"; do
			kill -0 -- "-$pid" 2>/dev/null && left+=("$pid")
		done
		groups=("${left[@]}")
		((${#groups[@]})) || break
		if ((SECONDS >= deadline)); then
			echo "demo: still running after ${GPUNODE_DEMO_STOP_TIMEOUT:-25}s, sending KILL to process groups ${groups[*]}" >&2
			for pid in "${groups[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
			break
		fi
		sleep 0.2 # poll interval
	done
}

# Returns when a node changes, or after 2 s at the latest: the live view redraws on what happens.
next_change() {
	timeout 2 "$KUBECTL" get nodes --watch-only -o name 2>/dev/null | head -n 1 >/dev/null || true
}

label() { "$KUBECTL" get node "$1" -o jsonpath="{.metadata.labels.${2//./\\.}}" 2>/dev/null; }

# node_row NODE PODS: one row of the node table: gpunode's state label, the GpuPolicyCompliant
# reason, gpunode's taint, the cordon, and PODS (a count of the demo's pods on it).
node_row() {
	"$KUBECTL" get node "$1" -o jsonpath='{.metadata.name}{"\t"}{.metadata.labels.gpunode\.dev/state}{"\t"}{.status.conditions[?(@.type=="GpuPolicyCompliant")].reason}{"\t"}{range .spec.taints[?(@.key=="gpunode.dev/drift")]}{.value}:{.effect}{end}{"\t"}{.spec.unschedulable}{"\t"}'
	echo "$2"
}

# compliant_row NODE...: how many of the nodes are compliant, as one row.
compliant_row() {
	local n ok=0
	for n in "$@"; do [[ $(label "$n" gpunode.dev/state) == compliant ]] && ok=$((ok + 1)); done
	printf '%s..%s\t%s of %s compliant\t\t\t\t\n' "$1" "${!#}" "$ok" "$#"
}

# The live view: what a platform engineer looks at while gpunode acts.
screen() {
	local n
	printf '\033[1mgpunode demo\033[0m  %s   KUBECONFIG=%s\n\n' "$(date +%T)" "$KUBECONFIG"
	printf '$ kubectl get gnp\n'
	"$KUBECTL" get gnp
	printf '\n$ kubectl get nodes   (gpunode state label, GpuPolicyCompliant reason, gpunode taint, cordon, demo pods)\n'
	{
		printf 'NODE\tSTATE\tCONDITION\tTAINT\tUNSCHEDULABLE\tPODS\n'
		compliant_row "${HEALTHY[@]}"
		for n in "$HOT" "$ROCE" "$XID"; do node_row "$n" "$(trainers_on "$n") trainer"; done
		compliant_row "${H200_HEALTHY[@]}"
		for n in "$H200_HOT" "$H200_REMAP"; do node_row "$n" -; done
		node_row "$NVL" "$(inference_on "$NVL") inference"
	} | column -t -s $'\t'
	printf '\n$ kubectl -n training get pods,pdb\n'
	"$KUBECTL" -n training get pods -o wide --no-headers 2>/dev/null | awk '{printf "pod/%-28s %-12s %s\n", $1, $3, $7}'
	"$KUBECTL" -n training get pdb trainer --no-headers 2>/dev/null |
		awk '{printf "pdb/trainer  maxUnavailable %s, allowed disruptions now: %s\n", $3, $4}'
	printf '\n$ kubectl -n inference get pods   (one GPU each, by DRA, on %s)\n' "$NVL"
	"$KUBECTL" -n inference get pods --no-headers 2>/dev/null | awk '{print $3}' | sort | uniq -c |
		awk '{printf "%s %s  ", $1, $2} END {print ""}'
	printf '\n$ kubectl get devicetaintrules   (gpunode quarantines one GPU of %s)\n' "$NVL"
	"$KUBECTL" get devicetaintrules -o jsonpath='{range .items[*]}{.spec.deviceSelector.pool}{"/"}{.spec.deviceSelector.device}{"  "}{.spec.taint.effect}{"\n"}{end}' 2>/dev/null
	printf '\n$ kubectl get gpuresetrequests   (the repair ladder resets a GPU of %s through its gpu-reset pod)\n' "$H200_REMAP"
	"$KUBECTL" get gpuresetrequests -o jsonpath='{range .items[*]}{.metadata.name}{"  "}{.status.phase}{"\n"}{end}' 2>/dev/null
	printf '\n$ kubectl get events  (from gpunode-operator, newest last)\n'
	"$KUBECTL" get events -A --sort-by=.metadata.creationTimestamp \
		-o jsonpath='{range .items[?(@.reportingComponent=="gpunode-operator")]}{.involvedObject.name}{"  "}{.reason}{": "}{.message}{"\n"}{end}' 2>/dev/null |
		cut -c1-150
	leader_metrics
}

# The leader's own account of what it did (its /metrics).
leader_metrics() {
	local f port m
	for f in "$WORK"/operator-*.port; do
		[[ -e $f ]] || continue
		port=$(cat "$f")
		m=$(curl -sf --max-time 2 "http://127.0.0.1:$port/metrics") || continue
		grep -q '^gpunode_leader 1' <<<"$m" || continue
		printf '\n$ curl <leader>:%s/metrics   (gpunode_actions_total)\n' "$port"
		# Wrapped between items only, never inside one, so every line holds whole items.
		awk -F'[{}" ]+' '
			/^gpunode_actions_total\{/ && $NF != "0" {
				item = sprintf("%s %s: %s", $3, $5, $NF)
				if (line != "" && length(line) + 3 + length(item) > 108) { print "  " line; line = "" }
				line = (line == "" ? item : line "   " item)
			}
			END { if (line != "") print "  " line }' <<<"$m"
	done
}

# show_screen [final]: draw the live view. On a terminal it replaces the last one; elsewhere (a
# log) a screen is printed only when it differs from the last one printed, clock line aside, and
# the final one always.
show_screen() {
	screen >"$WORK/screen.txt" 2>&1 || true
	if [[ -t 1 ]]; then
		clear
		cat "$WORK/screen.txt"
		return
	fi
	if [[ ${1:-} == final ]] || ! tail -n +2 "$WORK/screen.txt" | cmp -s - "$WORK/screen.last" 2>/dev/null; then
		cat "$WORK/screen.txt"
		echo
	fi
	tail -n +2 "$WORK/screen.txt" >"$WORK/screen.last"
}

# The names of the policies in examples/, comma-separated.
example_names() {
	sed -n 's/^  name: //p' "$ROOT"/examples/*.yaml | paste -sd, | sed 's/,/, /g'
}

end_state_reached() {
	local n
	for n in "${HEALTHY[@]}"; do [[ $(label "$n" gpunode.dev/state) == compliant ]] || return 1; done
	[[ $(label "$ROCE" gpunode.dev/state) == drifted ]] || return 1
	"$KUBECTL" get node "$HOT" -o jsonpath='{.spec.taints[?(@.key=="gpunode.dev/drift")].effect}' | grep -q NoSchedule || return 1
	[[ $("$KUBECTL" get node "$XID" -o jsonpath='{.spec.unschedulable}') == true ]] || return 1
	(($(trainers_on "$XID") == 0)) || return 1
	[[ $("$KUBECTL" get node "$XID" -o jsonpath='{.status.conditions[?(@.type=="GpuPolicyCompliant")].reason}') == Drained ]] || return 1
	(($(running_pods training app=trainer | wc -l) == 3)) || return 1
	h200_end_state_reached && nvl_end_state_reached
}

# The H200 pool: h200-hot drifts but waits for the window (no taint); h200-remap was drained at
# once (Memory is urgent) and its probe reset GPU $H200_BAD_GPU; the rest compliant.
h200_end_state_reached() {
	local n
	for n in "${H200_HEALTHY[@]}"; do [[ $(label "$n" gpunode.dev/state) == compliant ]] || return 1; done
	[[ $(label "$H200_HOT" gpunode.dev/state) == drifted ]] || return 1
	[[ -z $("$KUBECTL" get node "$H200_HOT" -o jsonpath='{.spec.taints[?(@.key=="gpunode.dev/drift")].effect}') ]] || return 1
	[[ $("$KUBECTL" get node "$H200_REMAP" -o jsonpath='{.spec.unschedulable}') == true ]] || return 1
	[[ $("$KUBECTL" get gpuresetrequest "$H200_REMAP-gpu-$H200_BAD_GPU" -o jsonpath='{.status.phase}') == Succeeded ]] || return 1
	[[ $(label "$H200_REMAP" gpunode.dev/state) == compliant ]] || return 1
	# The report after the reset was heard: the repair is judged (no step awaits a report).
	local message
	message=$("$KUBECTL" get node "$H200_REMAP" -o jsonpath='{.status.conditions[?(@.type=="GpuPolicyCompliant")].message}')
	[[ $message == *"drained at"* && $message != *"repair step"* ]] || return 1
}

# The NVL node: one DeviceTaintRule (NoExecute) on GPU $NVL_BAD_GPU's device, 7 of the 8 inference
# pods still running there, the node itself schedulable.
nvl_end_state_reached() {
	[[ $("$KUBECTL" get devicetaintrules -o jsonpath='{range .items[*]}{.spec.deviceSelector.device}:{.spec.taint.effect}{"\n"}{end}') == "gpu-$NVL_BAD_GPU:NoExecute" ]] || return 1
	(($(inference_on "$NVL") == 7)) || return 1
	# The evicted replica is gone and its replacement waits: no GPU of the node is left for it.
	(($("$KUBECTL" -n inference get pods --no-headers 2>/dev/null | wc -l) == 8)) || return 1
	[[ -z $("$KUBECTL" get node "$NVL" -o jsonpath='{.spec.unschedulable}') ]] || return 1
}

# plugin_views: what `kubectl gpunode` says about the end state, printed and kept in $WORK/plugin
# (README's kubectl gpunode section shows these, e2e/tests/demo.rs compares them).
plugin_views() {
	local name args
	mkdir -p "$WORK/plugin"
	while IFS='|' read -r name args; do
		# shellcheck disable=SC2086 # the arguments are words
		{
			echo "\$ kubectl gpunode $args"
			"$BIN/kubectl-gpunode" $args 2>&1 || true
		} | tee "$WORK/plugin/$name.txt"
		echo
	done <<VIEWS
status|status
why-$H200_HOT|why $H200_HOT
why-$H200_REMAP|why $H200_REMAP
why-$XID|why $XID
gpus-$NVL|gpus $NVL
approve-$H200_HOT|approve $H200_HOT Taint
VIEWS
}

explore_help() {
	cat <<EOF

The demo keeps running. Explore it:

  export KUBECONFIG=$KUBECONFIG
  kubectl get gnp                                   # policies: matched / compliant / drifted
  kubectl get gnr                                   # one report per GPU node, from its probe
  kubectl describe node $HOT                   # condition GpuPolicyCompliant, taint, events
  kubectl get nodes -L gpunode.dev/state,gpunode.dev/drift.Throttle
  kubectl get gnp h100-training -o yaml             # status: conditions, drifted nodes and why

Change a node and watch the operator react (e2e/demo/ctl.sh help lists everything):

  e2e/demo/ctl.sh heat h100-003                     # throttle a GPU: tainted after 'after: 30s'
  e2e/demo/ctl.sh cool $HOT                    # recover: untainted after 'healthyFor: 5m'
  e2e/demo/ctl.sh break-roce h100-004 trust-pcp     # RoCE drift: labelled at once, tainted after 2m if the budget allows
  e2e/demo/ctl.sh fix-roce $ROCE
  e2e/demo/ctl.sh xid h100-005                      # uncorrectable ECC + XID 79: cordon and drain
  e2e/demo/ctl.sh watch                             # this live view again
  e2e/demo/ctl.sh check $HOT                   # gpunode-operator check on the node's live report

Logs: $LOGS (operator-0.log, operator-1.log: one of them is the leader; probe-<node>.log)
Stop everything: make demo-down
EOF
}
