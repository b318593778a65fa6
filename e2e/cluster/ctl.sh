#!/usr/bin/env bash
# Fault injection on one component of a running local control plane (started by up.sh).
#
# Usage:  ctl.sh ACTION COMPONENT      (cluster: GPUNODE_CLUSTER_NAME=NAME or GPUNODE_CLUSTER_DIR=/abs/dir)
#   stop     save the component's command line and environment, then TERM it (KILL after 15 s)
#   start    start it again from what `stop` saved: same binary, flags, ports and data directory
#   pause    SIGSTOP (the process keeps its sockets but answers nothing: a hung etcd or apiserver)
#   resume   SIGCONT
#   pid      print its pid
# COMPONENT: etcd kube-apiserver kube-controller-manager kube-scheduler kwok
# up.sh restarts a partly running cluster from scratch (new ports, empty etcd); ctl.sh keeps
# everything, so clients with the old kubeconfig reconnect to the same address.
set -euo pipefail
PROG=ctl.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case "${1:-}" in -h | --help | "") sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 0 ;; esac
action=$1
comp=${2:-}
[[ " ${COMPONENTS[*]} " == *" $comp "* ]] || die "unknown component '$comp' (one of: ${COMPONENTS[*]})"
resolve_cluster_dir ""
[[ -d $RUN ]] || die "no cluster in $D"

running_pid() {
	local pid
	pid=$(comp_pid "$comp") || die "$comp has no pid file in $RUN"
	our_pid "$pid" || die "$comp (pid $pid) is not running"
	printf '%s' "$pid"
}

case $action in
pid) running_pid; echo ;;
pause) kill -STOP "$(running_pid)" ;;
resume) kill -CONT "$(running_pid)" ;;
stop)
	pid=$(running_pid)
	# what `start` needs to run it again exactly (NUL-separated, as the kernel keeps them)
	cp "/proc/$pid/cmdline" "$RUN/$comp.cmdline"
	cp "/proc/$pid/environ" "$RUN/$comp.environ"
	kill -CONT "$pid" 2>/dev/null || true # a paused process cannot act on TERM
	stop_pids "${GPUNODE_STOP_TIMEOUT:-15}" "$pid" || die "$comp (pid $pid) did not stop"
	rm -f "$RUN/$comp.pid"
	;;
start)
	[[ -s $RUN/$comp.cmdline ]] || die "$comp was not stopped by ctl.sh (no saved command line)"
	if pid=$(comp_pid "$comp") && our_pid "$pid"; then die "$comp is already running (pid $pid)"; fi
	mapfile -d '' -t cmd <"$RUN/$comp.cmdline"
	mapfile -d '' -t envs <"$RUN/$comp.environ"
	printf '\n==== %s: ctl.sh start: %s\n' "$(date -u +%FT%TZ)" "${cmd[*]}" >>"$LOGS/$comp.log"
	# Same detaching as up.sh's start(): own session, no inherited descriptors, pid file by the process.
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid env -i "${envs[@]}" "$BASH" -c 'fds=(/proc/$$/fd/*); for fd in "${fds[@]##*/}"; do ((fd > 2)) && { eval "exec $fd>&-" 2>/dev/null || :; }; done
		echo $$ >"$0"; exec "$@"' "$RUN/$comp.pid" "${cmd[@]}" </dev/null >>"$LOGS/$comp.log" 2>&1 9>&- &
	deadline=$((SECONDS + 10))
	until [[ -s $RUN/$comp.pid ]]; do
		((SECONDS < deadline)) || die "$comp did not start (no pid file)"
		sleep 0.02 # poll interval
	done
	;;
*) die "unknown action '$action' (stop, start, pause, resume, pid)" ;;
esac
