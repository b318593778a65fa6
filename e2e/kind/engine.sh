#!/usr/bin/env bash
# The Docker engine of the kind cluster, the project's own: installs what is missing from Debian's
# packages (docker.io, debootstrap), starts dockerd on its own socket with runc-caps as its default
# runtime, and stops it again leaving no daemon, container or network behind.
#
# Usage:  e2e/kind/engine.sh start | stop | status
#         eval "$(e2e/kind/engine.sh env)"   point docker at the project's daemon
# Exit 3 from start: no Docker engine can run on this machine (the reason is printed).
set -euo pipefail
PROG=e2e/kind/engine.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cannot() { printf '%s: no Docker engine on this machine: %s\n' "$PROG" "$*" >&2; exit 3; }

running() { [[ -S $ENGINE_RUN/docker.sock ]] && docker info >/dev/null 2>&1; }
dockerd_pid() { [[ -f $ENGINE_RUN/dockerd.pid ]] && cat "$ENGINE_RUN/dockerd.pid" 2>/dev/null; }

install_packages() {
	local need=()
	[[ -x /usr/sbin/dockerd && -x /usr/bin/docker ]] || need+=(docker.io)
	command -v debootstrap >/dev/null || need+=(debootstrap)
	((${#need[@]})) || return 0
	((EUID == 0)) || cannot "${need[*]} missing and not root to install them"
	command -v apt-get >/dev/null || cannot "${need[*]} missing and no apt-get"
	log "installing ${need[*]} from Debian's packages"
	local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}")
	# A machine whose package lists are missing or stale gets them refreshed once.
	if ! "${apt[@]}" >"$CACHE/logs/apt-kind.log" 2>&1; then
		apt-get update >>"$CACHE/logs/apt-kind.log" 2>&1 || true
		"${apt[@]}" >>"$CACHE/logs/apt-kind.log" 2>&1 || {
			tail -n 20 "$CACHE/logs/apt-kind.log" >&2
			cannot "apt-get install ${need[*]} failed (log: $CACHE/logs/apt-kind.log)"
		}
	fi
}

# The programs of e2e/kind/progs (pause, runc-caps, workload), built once per source hash.
build_progs() {
	local key dir
	command -v go >/dev/null || die "Go is needed to build e2e/kind/progs"
	key=$(hash_of "$KIND_HERE/progs")
	dir=$CACHE/kind/progs-$key
	if [[ ! -x $dir/pause || ! -x $dir/runc-caps || ! -x $dir/workload ]]; then
		rm -rf "$dir.tmp"
		mkdir -p "$dir.tmp"
		(cd "$KIND_HERE/progs" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$dir.tmp/" ./pause ./runc-caps ./workload) ||
			die "go build of e2e/kind/progs failed"
		rm -rf "$dir"
		mv "$dir.tmp" "$dir"
		find "$CACHE/kind" -maxdepth 1 -name 'progs-*' ! -name "progs-$key" -exec rm -rf {} +
	fi
	ln -sfn "$dir" "$CACHE/kind/progs"
}

start() {
	mkdir -p "$CACHE/logs" "$KIND_BIN" "$ENGINE_DATA" "$ENGINE_RUN"
	[[ $(uname -s) == Linux ]] || cannot "not Linux"
	install_packages
	ln -sfn /usr/bin/docker "$KIND_BIN/docker"
	build_progs
	if running; then
		log "engine: already running ($DOCKER_HOST)"
		return 0
	fi
	local pid
	pid=$(dockerd_pid || true)
	[[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null || die "dockerd $pid runs but does not answer on $DOCKER_HOST"
	log "engine: starting dockerd (data $ENGINE_DATA, socket $DOCKER_HOST)"
	# --bridge=none: no docker0; kind makes its own network. --iptables=false: the host's firewall is
	# left as it is (dockerd would set FORWARD to DROP and add chains that outlive it); published
	# ports (the API server on 127.0.0.1) go through docker-proxy. The wrapper drops capabilities
	# the host's bounding set lacks (see progs/runc-caps).
	RUNC_CAPS_REAL=$(command -v runc || echo /usr/sbin/runc) \
		setsid /usr/sbin/dockerd --data-root "$ENGINE_DATA" --exec-root "$ENGINE_RUN/exec" \
		--pidfile "$ENGINE_RUN/dockerd.pid" --host "$DOCKER_HOST" --bridge=none --iptables=false --ip-masq=false \
		--add-runtime "gpunode-runc=$CACHE/kind/progs/runc-caps" --default-runtime gpunode-runc \
		--log-level warn >>"$CACHE/logs/dockerd.log" 2>&1 </dev/null &
	local deadline=$((SECONDS + 60))
	until running; do
		if ! kill -0 $! 2>/dev/null; then
			tail -n 20 "$CACHE/logs/dockerd.log" >&2
			cannot "dockerd exited at start (log: $CACHE/logs/dockerd.log)"
		fi
		((SECONDS < deadline)) || cannot "dockerd did not answer within 60 s (log: $CACHE/logs/dockerd.log)"
		sleep 0.5 # poll the socket
	done
	# A privileged container is what kind needs: prove the runtime can start one.
	if ! docker run --rm --privileged --network none "$(base_image)" true >/dev/null 2>"$ENGINE_RUN/probe.err"; then
		cat "$ENGINE_RUN/probe.err" >&2
		cannot "a privileged container does not start"
	fi
	log "engine: ready ($(docker version --format '{{.Server.Version}}'))"
}

# A one-file image to try the runtime with (no registry to pull from).
base_image() {
	local tag=gpunode.local/engine-check:1
	if ! docker image inspect "$tag" >/dev/null 2>&1; then
		local d
		d=$(mktemp -d)
		cp "$CACHE/kind/progs/pause" "$d/true"
		tar -C "$d" -c true | docker import --change 'ENTRYPOINT ["/true", "-v"]' - "$tag" >/dev/null
		rm -rf "$d"
	fi
	printf '%s' "$tag"
}

stop() {
	local pid
	pid=$(dockerd_pid || true)
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		if running; then
			local left
			left=$(docker ps -aq)
			[[ -z $left ]] || docker rm -f $left >/dev/null || true
		fi
		kill "$pid"
		# Blocks until it exits (it stops its containerd first), at most 60 s, then kills it.
		timeout 60 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true
	fi
	# Its containerd, shims and anything else started from our exec root.
	pkill -f "$ENGINE_RUN/exec" 2>/dev/null || true
	# The daemon's runtime state (sockets, task directories) goes with it; nothing is mounted
	# there once its processes are gone.
	if ! grep -q " $ENGINE_RUN" /proc/mounts; then
		rm -rf "$ENGINE_RUN"
	else
		rm -f "$ENGINE_RUN/docker.sock" "$ENGINE_RUN/dockerd.pid"
	fi
	log "engine: stopped"
}

status() {
	if running; then
		log "engine: running ($DOCKER_HOST), $(docker ps -q | wc -l) containers"
	else
		log "engine: not running"
		return 1
	fi
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) status ;;
env) printf 'export DOCKER_HOST=%q PATH=%q\n' "$DOCKER_HOST" "$PATH" ;;
*) die "usage: $PROG start|stop|status|env" ;;
esac
