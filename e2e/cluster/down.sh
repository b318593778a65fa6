#!/usr/bin/env bash
# Stop the local control plane started by up.sh: every component by its PID (TERM, then KILL after
# GPUNODE_STOP_TIMEOUT seconds, default 15), clients first and etcd last, then check with pgrep that
# no process of the cluster directory is left.
#
# Usage:  down.sh [NAME] [--purge]      (or GPUNODE_CLUSTER_NAME=NAME / GPUNODE_CLUSTER_DIR=/abs/dir)
#   --purge   also delete the cluster's state (etcd data, pki, logs, kubeconfigs); default keeps logs
# Exit status 0 when nothing of that cluster is running afterwards (also when it was not running).
set -euo pipefail
PROG=down.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

purge=0 name=
for a in "$@"; do
	case $a in
	--purge) purge=1 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 0 ;;
	-*) die "unknown option $a" ;;
	*) name=$a ;;
	esac
done
resolve_cluster_dir "$name"
mkdir -p "$RUN"
exec 9>"$D/.lock"
flock -w 120 9 || die "another up.sh/down.sh holds $D/.lock"

log "$PROG: stopping cluster '$CLUSTER_NAME' in $D"
stop_cluster || die "processes of $D are still running: $(leftover_pids | tr '\n' ' ')"
rm -f "$D/cluster.env"
if ((purge)); then
	rm -rf "$D/etcd" "$D/pki" "$D/logs" "$D/run" "$D/kwok-home" "$D"/*.kubeconfig "$D/kubeconfig" \
		"$D/scheduler-config.yaml" "$D/.lock"
	rmdir "$D" 2>/dev/null || true
fi
log "$PROG: cluster '$CLUSTER_NAME' stopped (no processes left)"
