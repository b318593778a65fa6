# shellcheck shell=bash
# shellcheck disable=SC2034 # variables set here are used by the scripts that source this file
# Shared helpers of up.sh, down.sh and nodes.sh. Sourced, not executed.

CLUSTER_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CLUSTER_HERE/../.." && pwd)
# start order; stopped in reverse
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '%s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

# resolve_cluster_dir [NAME] -> sets CLUSTER_NAME and D (absolute cluster directory).
# GPUNODE_CLUSTER_DIR wins; otherwise NAME (argument, else $GPUNODE_CLUSTER_NAME, else "default")
# selects <repo>/.cluster/NAME.
resolve_cluster_dir() {
	local name=${1:-${GPUNODE_CLUSTER_NAME:-default}}
	[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad cluster name '$name' (letters, digits, . _ -)"
	if [[ -n ${GPUNODE_CLUSTER_DIR:-} ]]; then
		D=$GPUNODE_CLUSTER_DIR
		name=$(basename "$D")
	else
		D=$REPO_ROOT/.cluster/$name
	fi
	mkdir -p "$D"
	D=$(cd "$D" && pwd -P)
	CLUSTER_NAME=$name
	RUN=$D/run
	LOGS=$D/logs
}

# regex-escape a path for pgrep -f
# shellcheck disable=SC2016 # a sed expression, no expansion wanted
re_escape() { printf '%s' "$1" | sed -e 's/[][\.*^$(){}?+|/]/\\&/g'; }

# our_pid PID: the process is alive and is one of our components for this cluster dir
# (guards against PID reuse: its command line names the cluster directory).
our_pid() {
	local pid=$1 cmd
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
	[[ $cmd == *"$D/"* ]]
}

# alive PID: the process exists and is not a zombie (an exited process that its parent, here often
# PID 1 of a container or VM, has not reaped yet)
alive() {
	local line rest
	[[ $1 =~ ^[0-9]+$ ]] || return 1
	line=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	rest=${line##*) }
	[[ ${rest%% *} != [ZX] ]]
}

comp_pid() { [[ -s $RUN/$1.pid ]] && cat "$RUN/$1.pid"; }

# leftover_pids: every process whose argv[0] is one of our component binaries and whose
# arguments name this cluster directory (pgrep against the cluster dir).
leftover_pids() {
	pgrep -f -- "^[^ ]*/(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok) .*$(re_escape "$D")/" || true
}

# stop_pids TIMEOUT PID...: TERM, poll until gone or TIMEOUT seconds, then KILL.
stop_pids() {
	local timeout=$1 pid running deadline
	shift
	(($#)) || return 0
	for pid; do kill -TERM "$pid" 2>/dev/null || true; done
	deadline=$((SECONDS + timeout))
	while :; do
		running=()
		for pid; do alive "$pid" && running+=("$pid"); done
		((${#running[@]})) || return 0
		if ((SECONDS >= deadline)); then
			log "  still running after ${timeout}s, sending KILL to ${running[*]}"
			kill -KILL "${running[@]}" 2>/dev/null || true
			deadline=$((SECONDS + 5))
			while :; do
				running=()
				for pid; do alive "$pid" && running+=("$pid"); done
				((${#running[@]})) || return 0
				((SECONDS < deadline)) || { log "  could not kill ${running[*]}"; return 1; }
				sleep 0.1 # poll interval
			done
		fi
		sleep 0.1 # poll interval
	done
}

# stop_cluster: stop every component of $D by PID, clients first, etcd last; then make sure no
# process of this cluster dir is left (pgrep). Returns non-zero if something survived.
stop_cluster() {
	local timeout=${GPUNODE_STOP_TIMEOUT:-15} c pid group rest
	for group in "kwok kube-scheduler kube-controller-manager" "kube-apiserver" "etcd"; do
		local pids=()
		for c in $group; do
			pid=$(comp_pid "$c") || continue
			if our_pid "$pid"; then
				log "  stopping $c (pid $pid)"
				pids+=("$pid")
			fi
		done
		stop_pids "$timeout" "${pids[@]}" || true
	done
	rm -f "$RUN"/*.pid
	mapfile -t rest < <(leftover_pids)
	if ((${#rest[@]})); then
		log "  leftover processes of $D: ${rest[*]}; stopping them"
		stop_pids 5 "${rest[@]}" || true
		mapfile -t rest < <(leftover_pids)
		if ((${#rest[@]})); then
			log "  processes still running for $D: ${rest[*]}"
			return 1
		fi
	fi
	return 0
}
