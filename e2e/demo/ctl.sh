#!/usr/bin/env bash
# Change the demo's fake GPU nodes while it runs, and look at what gpunode does about it.
# Each node's probe reads its NVML fixture and sysfs tree through symlinks under
# .cluster/demo/demo/nodes/<node>/, which these commands swap; the probe notices on its next
# collection (every 2 s) and publishes at once, the operator reacts to the new report.
#
# Usage: e2e/demo/ctl.sh COMMAND [NODE] [VARIANT]
#   heat NODE                  one GPU thermally throttled (HW + SW thermal slowdown)
#   cool NODE                  all eight GPUs healthy again
#   xid NODE                   an uncorrectable ECC error and XID 79 (GPU fallen off the bus) happen
#                              now; the probe keeps the XID until the node reboots, even across its
#                              own restarts (after `cool`, `xid` makes a new one happen)
#   nvml NODE FIXTURE          any fixture in node-probe/fake-nvml/fixtures (e.g. pcie-gen4-x8)
#   break-roce NODE [VARIANT]  pfc-wrong-priority (default), trust-pcp, mtu-1500, one-port-down,
#                              no-rocev2-gid, ofed-ecn-absent
#   fix-roce NODE              the correct lossless tree again
#   watch                      the live view
#   check NODE                 `gpunode-operator check` on the node's live report and h100-training
#   env                        print `export KUBECONFIG=...`
#   nodes                      list the nodes and their current fixtures
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$ROOT/e2e/demo/lib.sh"
[[ -f $WORK/kubeconfig-path ]] || die "the demo is not running: start it with make demo"
KUBECONFIG=$(cat "$WORK/kubeconfig-path")
export KUBECONFIG

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
node_dir() {
	[[ -n ${1:-} ]] || die "which node? (e2e/demo/ctl.sh nodes)"
	[[ -d $WORK/nodes/$1 ]] || die "no demo node '$1' (e2e/demo/ctl.sh nodes lists them)"
	echo "$WORK/nodes/$1"
}
set_nvml() {
	local dir
	dir=$(node_dir "$1")
	[[ -f $NVML_FIXTURES/$2.json ]] || die "no NVML fixture '$2' (see node-probe/fake-nvml/fixtures)"
	ln -sfn "$NVML_FIXTURES/$2.json" "$dir/nvml.json"
	echo "$1: NVML fixture now $2"
}
set_tree() {
	local dir
	dir=$(node_dir "$1")
	[[ -d $SYSFS_FIXTURES/$2/sys ]] || die "no sysfs fixture '$2' (see node-probe/tests/fixtures/sysfs)"
	ln -sfn "$SYSFS_FIXTURES/$2" "$dir/tree"
	echo "$1: sysfs tree now $2"
}

case ${1:-help} in
heat) set_nvml "${2:-}" throttled ;;
cool) set_nvml "${2:-}" healthy-8xh100 ;;
xid)
	# NVML delivers an XID only to a probe listening when it happens.
	node_dir "${2:-}" >/dev/null
	probe_listening "$2" || die "$2's probe has not registered for XID events yet (see $LOGS/probe-$2.log)"
	set_nvml "${2:-}" ecc-xid79
	;;
nvml) set_nvml "${2:-}" "${3:?fixture name}" ;;
break-roce) set_tree "${2:-}" "${3:-pfc-wrong-priority}" ;;
fix-roce) set_tree "${2:-}" lossless-8port ;;
watch)
	while true; do
		screen >"$WORK/screen.txt" 2>&1 || true
		clear
		cat "$WORK/screen.txt"
		next_change
	done
	;;
check)
	dir=$(node_dir "${2:-}")
	"$KUBECTL" get gnr "$2" -o yaml >"$dir/report.yaml"
	"$KUBECTL" get node "$2" -o yaml >"$dir/node.yaml"
	"$BIN/gpunode-operator" check --policy "$ROOT/examples/h100-training.yaml" --report "$dir/report.yaml" \
		--node "$dir/node.yaml" || true
	;;
env) echo "export KUBECONFIG=$KUBECONFIG" ;;
nodes)
	for d in "$WORK"/nodes/*/; do
		n=$(basename "$d")
		printf '%-12s nvml=%-22s sysfs=%s\n' "$n" "$(basename "$(readlink "$d/nvml.json")" .json)" "$(basename "$(readlink "$d/tree")")"
	done
	;;
help | -h | --help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
