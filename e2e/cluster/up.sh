#!/usr/bin/env bash
# Start a local Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and kwok (fake nodes), with generated certificates and free ports.
#
# Usage:  up.sh [NAME]        (or GPUNODE_CLUSTER_NAME=NAME / GPUNODE_CLUSTER_DIR=/abs/dir)
#   export KUBECONFIG=$(e2e/cluster/up.sh | tail -1)       # or: $(make -s cluster-up | tail -1)
#
# The LAST line on stdout is the absolute path of the admin kubeconfig; all progress goes to stderr.
# If the cluster in that directory is already up and healthy, it just prints the kubeconfig again.
# Cluster directory (default <repo>/.cluster/NAME, NAME=default): kubeconfig (admin), cluster.env
# (ports, URLs, pids, binaries as `export` lines), pki/, logs/<component>.log, run/<component>.pid, etcd/.
#
# Environment:
#   GPUNODE_CLUSTER_DIR   cluster directory (overrides NAME)
#   GPUNODE_SCALE=1       scale-run limits: apiserver --max-requests-inflight=5000
#                         --max-mutating-requests-inflight=5000, KCM/scheduler client QPS 5000 burst 10000
#                         (default: KCM QPS 100 burst 200, scheduler 50/100, apiserver defaults 400/200)
#   GPUNODE_UP_TIMEOUT    readiness deadline per component in seconds (default 60)
#   GPUNODE_UP_API_PORT, GPUNODE_UP_ETCD_PORT, GPUNODE_UP_KCM_PORT, GPUNODE_UP_SCHEDULER_PORT, GPUNODE_UP_KWOK_PORT
#                         fixed port for the first attempt (default: a free port; a port in use is retried)
#   GPUNODE_NO_BUILD=1    fail instead of running build.sh when the binaries are not built yet
#   GPUNODE_APISERVER_ARGS, GPUNODE_KCM_ARGS, GPUNODE_SCHEDULER_ARGS, GPUNODE_KWOK_ARGS, GPUNODE_ETCD_ARGS
#                         extra flags (whitespace-separated) appended to that component
#   K8S_VERSION, GPUNODE_CACHE   passed to build.sh (which binaries to use)
set -euo pipefail
PROG=up.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case "${1:-}" in -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 0 ;; esac
T_START=$(date +%s.%N)
resolve_cluster_dir "${1:-}"
TIMEOUT=${GPUNODE_UP_TIMEOUT:-60}
KUBECONFIG_OUT=$D/kubeconfig

for tool in curl openssl setsid pgrep flock ss; do
	command -v "$tool" >/dev/null 2>&1 || die "required tool '$tool' not found on PATH"
done

# ---- binaries ----------------------------------------------------------------------------------
if ! envlines=$("$CLUSTER_HERE/build.sh" --print-env 2>/dev/null); then
	[[ ${GPUNODE_NO_BUILD:-} == 1 ]] && die "binaries not built: run e2e/cluster/build.sh (make cluster-build)"
	log "$PROG: binaries not built yet; running build.sh (the first build takes a while)"
	"$CLUSTER_HERE/build.sh" >&2 || die "build.sh failed"
	envlines=$("$CLUSTER_HERE/build.sh" --print-env) || die "build.sh --print-env failed after a build"
fi
eval "$envlines"

# ---- one up/down at a time per cluster dir ------------------------------------------------------
mkdir -p "$RUN" "$LOGS"
exec 9>"$D/.lock"
flock -w 120 9 || die "another up.sh/down.sh holds $D/.lock"

api_ready() { # PORT
	curl -sf --max-time 3 --cacert "$D/pki/ca.crt" --cert "$D/pki/admin.crt" --key "$D/pki/admin.key" \
		"https://127.0.0.1:$1/readyz" >/dev/null 2>&1
}

# what makes a running cluster reusable: its binaries and start-up options
UP_KEY="$GPUNODE_ETCD $GPUNODE_KUBE_APISERVER $GPUNODE_KWOK scale=${GPUNODE_SCALE:-0} ${GPUNODE_ETCD_ARGS:-}|${GPUNODE_APISERVER_ARGS:-}|${GPUNODE_KCM_ARGS:-}|${GPUNODE_SCHEDULER_ARGS:-}|${GPUNODE_KWOK_ARGS:-}"

# ---- already up? ---------------------------------------------------------------------------------
if [[ -f $D/cluster.env && -f $KUBECONFIG_OUT ]]; then
	all=1
	for c in "${COMPONENTS[@]}"; do
		if ! pid=$(comp_pid "$c") || ! our_pid "$pid"; then
			all=0
			break
		fi
	done
	# same binaries and options as asked for now?
	[[ $(sed -n 's/^export GPUNODE_UP_KEY=//p' "$D/cluster.env") == "$(printf '%q' "$UP_KEY")" ]] || all=0
	if ((all)); then
		port=$(sed -n 's/^export GPUNODE_API_PORT=//p' "$D/cluster.env")
		deadline=$((SECONDS + 10))
		until api_ready "$port"; do
			((SECONDS < deadline)) || { all=0; break; }
			sleep 0.5 # poll interval
		done
	fi
	if ((all)); then
		log "$PROG: cluster '$CLUSTER_NAME' is already up in $D"
		printf '%s\n' "$KUBECONFIG_OUT"
		exit 0
	fi
	log "$PROG: cluster in $D is not healthy, only partly running or was started with other binaries/options; restarting it from scratch"
fi
stop_cluster || die "could not stop the old processes of $D"

# fresh state (only our own subpaths: GPUNODE_CLUSTER_DIR may point anywhere)
rm -rf "$D/etcd" "$D/pki" "$LOGS" "$RUN" "$D/kwok-home" "$D/cluster.env" "$D"/*.kubeconfig "$KUBECONFIG_OUT" \
	"$D/scheduler-config.yaml"
mkdir -p "$D/pki" "$LOGS" "$RUN" "$D/kwok-home"

# Stop whatever this run started if it fails or is interrupted.
UP_OK=0
on_exit() {
	local rc=$?
	if ((UP_OK == 0)); then
		log "$PROG: start-up failed; stopping what was started (logs kept in $LOGS)"
		stop_cluster || true
		rm -f "$D/cluster.env"
		((rc != 0)) || rc=1
	fi
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- PKI --------------------------------------------------------------------------------------------
log "$PROG: cluster '$CLUSTER_NAME' in $D (kubernetes $GPUNODE_K8S_VERSION, etcd $GPUNODE_ETCD_VERSION, kwok $GPUNODE_KWOK_VERSION)"
P=$D/pki
ossl() { openssl "$@" 2>>"$LOGS/openssl.log" || die "openssl $1 failed (see $LOGS/openssl.log)"; }
EC_KEY=(genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256)
# Every certificate is valid from a day ago: a process whose clock runs behind (the probe clock-skew
# faults, libfaketime) must still accept the serving certificate of a cluster started minutes ago.
# OpenSSL 3.0's x509 and req cannot set a start date; its ca command can, from a scratch database.
CA_DB=$P/ca-db
VALID_FROM=$(date -u -d '-1 day' +%Y%m%d%H%M%SZ)
ca_db() {
	mkdir -p "$CA_DB"
	: >"$CA_DB/index.txt"
	cat >"$CA_DB/ca.cnf" <<-EOF
		[ca]
		default_ca = signer
		[signer]
		database = $CA_DB/index.txt
		new_certs_dir = $CA_DB
		default_md = sha256
		rand_serial = yes
		policy = any_name
		unique_subject = no
		copy_extensions = none
		[any_name]
		organizationName = optional
		commonName = supplied
	EOF
}
# issue CSR OUT DAYS EXTENSIONS [CA]: sign CSR with CA's key (none: self-signed), valid from VALID_FROM
issue() {
	local signer=(-selfsign -keyfile "$P/$1.key")
	[[ -n ${5:-} ]] && signer=(-cert "$P/$5.crt" -keyfile "$P/$5.key")
	ossl ca -batch -config "$CA_DB/ca.cnf" "${signer[@]}" -in "$2" -out "$P/$1.crt" -startdate "$VALID_FROM" \
		-days "$3" -notext -preserveDN -extfile <(printf '%s\n' "$4")
}
# sign NAME SUBJECT EXTENSIONS [CA]: EC P-256 key + certificate signed by CA (default: ca)
sign() {
	ossl "${EC_KEY[@]}" -out "$P/$1.key"
	ossl req -new -key "$P/$1.key" -subj "$2" -out "$P/$1.csr"
	issue "$1" "$P/$1.csr" 365 "$3" "${4:-ca}"
	rm -f "$P/$1.csr"
}
# ca_cert NAME CN: a self-signed CA
ca_cert() {
	ossl "${EC_KEY[@]}" -out "$P/$1.key"
	ossl req -new -key "$P/$1.key" -subj "/CN=$2" -out "$P/$1.csr"
	issue "$1" "$P/$1.csr" 3650 "basicConstraints=critical,CA:TRUE
keyUsage=critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier=hash"
	rm -f "$P/$1.csr"
}
SERVER_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
CLIENT_EXT="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
# One CA for serving and client certs (as kubeadm's ca), a front-proxy CA for the aggregation layer
# (requestheader: KCM and the scheduler read it from extension-apiserver-authentication) and an RSA
# service-account signing key (RS256).
make_pki() {
	ca_db
	ca_cert ca "gpunode-$CLUSTER_NAME-ca"
	sign apiserver "/CN=kube-apiserver" "$SERVER_EXT"
	sign admin "/O=system:masters/CN=gpunode-admin" "$CLIENT_EXT"
	sign kube-controller-manager "/CN=system:kube-controller-manager" "$CLIENT_EXT"
	sign kube-scheduler "/CN=system:kube-scheduler" "$CLIENT_EXT"
	ca_cert front-proxy-ca "gpunode-$CLUSTER_NAME-front-proxy-ca"
	sign front-proxy-client "/CN=front-proxy-client" "$CLIENT_EXT" front-proxy-ca
	ossl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$P/sa.key"
	ossl pkey -in "$P/sa.key" -pubout -out "$P/sa.pub"
	rm -rf "$CA_DB"
	chmod 600 "$P"/*.key
}

# ---- ports -------------------------------------------------------------------------------------------
# Below the kernel's ephemeral range so outgoing connections never hold them; skip any port with a
# socket on it and the ones this run already picked. A lost race shows up as "address already in use"
# in the component's log and is retried on another port.
read -r EPH_LOW _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || EPH_LOW=32768
((EPH_LOW > 12000)) || EPH_LOW=32768
PICKED=" "
pick_port() { # VAR: set VAR to a free port
	local p i
	for ((i = 0; i < 200; i++)); do
		p=$((10000 + RANDOM % (EPH_LOW - 10000)))
		[[ $PICKED == *" $p "* ]] && continue
		[[ -z $(ss -Htan "( sport = :$p )" 2>/dev/null) ]] || continue
		PICKED+="$p "
		printf -v "$1" '%s' "$p"
		return 0
	done
	die "no free port found below $EPH_LOW"
}

# ---- kubeconfigs --------------------------------------------------------------------------------
b64() { base64 -w0 <"$1"; }
write_kubeconfig() { # FILE USER(cert name)
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpunode-$CLUSTER_NAME
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(b64 "$P/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$P/$2.crt")
    client-key-data: $(b64 "$P/$2.key")
contexts:
- name: gpunode-$CLUSTER_NAME
  context:
    cluster: gpunode-$CLUSTER_NAME
    user: $2
current-context: gpunode-$CLUSTER_NAME
EOF
	chmod 600 "$1"
}

# ---- process management -----------------------------------------------------------------------------
# start NAME CMD...: detached (own session), stdin /dev/null, stdout+stderr to logs/NAME.log, no other
# inherited file descriptors (so `up.sh | tail -1` returns); the pid file is written by the process itself.
start() {
	local name=$1 deadline
	shift
	rm -f "$RUN/$name.pid"
	printf '\n==== %s: %s\n' "$(date -u +%FT%TZ)" "$*" >>"$LOGS/$name.log"
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid bash -c 'fds=(/proc/$$/fd/*); for fd in "${fds[@]##*/}"; do ((fd > 2)) && { eval "exec $fd>&-" 2>/dev/null || :; }; done
		echo $$ >"$0"; exec "$@"' "$RUN/$name.pid" "$@" </dev/null >>"$LOGS/$name.log" 2>&1 9>&- &
	deadline=$((SECONDS + 10))
	until [[ -s $RUN/$name.pid ]]; do
		((SECONDS < deadline)) || die "$name did not start (no pid file)"
		sleep 0.02 # poll interval
	done
}

# wait_ready NAME CHECK...: poll CHECK until it succeeds (0), the process dies (2) or the deadline (1).
wait_ready() {
	local name=$1 pid deadline
	shift
	pid=$(comp_pid "$name")
	deadline=$((SECONDS + TIMEOUT))
	while :; do
		"$@" && return 0
		alive "$pid" || return 2
		((SECONDS < deadline)) || return 1
		sleep 0.2 # poll interval
	done
}

fail_component() { # NAME WHY
	log "$PROG: $1 $2; last 40 lines of $LOGS/$1.log:"
	tail -n 40 "$LOGS/$1.log" | sed 's/^/    /' >&2
	exit 1
}

# spawn NAME: build the command line with cmd_NAME and start it
spawn() {
	local -a cmd
	"cmd_${1//-/_}"
	start "$1" "${cmd[@]}"
}

elapsed() { awk -v a="$T_START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ensure_ready NAME PORTVARS CHECK-FUNCTION: wait for CHECK-FUNCTION; when the process died with
# "address already in use", pick new ports for PORTVARS and start it again (3 attempts in all).
ensure_ready() {
	local name=$1 portvars=$2 check=$3 attempt rc v
	for attempt in 1 2 3; do
		rc=0
		wait_ready "$name" "$check" || rc=$?
		case $rc in
		0)
			log "  $name ready at +$(elapsed)s (pid $(comp_pid "$name"))"
			return 0
			;;
		1) fail_component "$name" "not ready within ${TIMEOUT}s" ;;
		esac
		if tail -n 30 "$LOGS/$name.log" | grep -qi 'address already in use' && ((attempt < 3)); then
			for v in $portvars; do pick_port "$v"; done
			log "  $name: port in use, retrying on new port(s) ($portvars)"
			[[ $name != etcd ]] || rm -rf "$D/etcd" # may hold a member bootstrapped with the old URLs
			spawn "$name"
			continue
		fi
		fail_component "$name" "exited during start-up"
	done
}

SCALE=${GPUNODE_SCALE:-0}
# KCM client rate limit: the default 20/30 makes the ~40 controller ServiceAccount tokens of
# --use-service-account-credentials take ~6 s at start-up; 100/200 gets the cluster ready ~5 s sooner.
QPS=(--kube-api-qps=100 --kube-api-burst=200)
# word-split extra args from the environment on purpose
read -r -a EXTRA_ETCD <<<"${GPUNODE_ETCD_ARGS:-}"
read -r -a EXTRA_API <<<"${GPUNODE_APISERVER_ARGS:-}"
read -r -a EXTRA_KCM <<<"${GPUNODE_KCM_ARGS:-}"
read -r -a EXTRA_SCHED <<<"${GPUNODE_SCHEDULER_ARGS:-}"
read -r -a EXTRA_KWOK <<<"${GPUNODE_KWOK_ARGS:-}"
API_INFLIGHT=()
SCHED_QPS=50 SCHED_BURST=100
if [[ $SCALE == 1 ]]; then
	API_INFLIGHT=(--max-requests-inflight=5000 --max-mutating-requests-inflight=5000)
	QPS=(--kube-api-qps=5000 --kube-api-burst=10000)
	SCHED_QPS=5000 SCHED_BURST=10000
fi

cmd_etcd() {
	cmd=("$GPUNODE_ETCD" --name=node0 --data-dir="$D/etcd"
		--listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT"
		--listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT"
		--initial-cluster="node0=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state=new
		--unsafe-no-fsync=true --quota-backend-bytes=8589934592
		--auto-compaction-mode=periodic --auto-compaction-retention=5m --snapshot-count=50000
		--log-level=warn "${EXTRA_ETCD[@]}")
}
etcd_ready() { curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }

# Admission: the default plugin set of the release (NamespaceLifecycle, LimitRanger, ServiceAccount,
# PodSecurity, Priority, DefaultTolerationSeconds, ResourceQuota, ValidatingAdmissionPolicy, webhooks, ...)
# plus NodeRestriction, as kubeadm does.
cmd_kube_apiserver() {
	# shellcheck disable=SC2054 # commas belong to flag values
	cmd=("$GPUNODE_KUBE_APISERVER" --etcd-servers="http://127.0.0.1:$ETCD_PORT" --etcd-prefix=/registry
		--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT"
		--cert-dir="$P" --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key"
		--client-ca-file="$P/ca.crt"
		--requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client
		--requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group
		--requestheader-extra-headers-prefix=X-Remote-Extra-
		--proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key"
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction
		--service-account-issuer=https://kubernetes.default.svc.cluster.local
		--service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key"
		--service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true
		--endpoint-reconciler-type=none
		--profiling=false
		"${API_INFLIGHT[@]}" "${EXTRA_API[@]}")
}
apiserver_ready() { api_ready "$API_PORT"; }

cmd_kube_controller_manager() {
	# shellcheck disable=SC2054 # commas belong to flag values
	cmd=("$GPUNODE_KUBE_CONTROLLER_MANAGER" --kubeconfig="$D/kube-controller-manager.kubeconfig"
		--authentication-kubeconfig="$D/kube-controller-manager.kubeconfig"
		--authorization-kubeconfig="$D/kube-controller-manager.kubeconfig"
		--bind-address=127.0.0.1 --secure-port="$KCM_PORT"
		--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics
		--leader-elect=false --use-service-account-credentials=true
		--controllers='*,bootstrapsigner,tokencleaner'
		--service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt"
		--cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key"
		--allocate-node-cidrs=true --cluster-cidr=10.128.0.0/9 --node-cidr-mask-size=24
		--service-cluster-ip-range=10.96.0.0/16
		--cluster-name="gpunode-$CLUSTER_NAME" --profiling=false
		"${QPS[@]}" "${EXTRA_KCM[@]}")
}
kcm_ready() { curl -skf --max-time 2 "https://127.0.0.1:$KCM_PORT/healthz" >/dev/null 2>&1; }

cmd_kube_scheduler() {
	cat >"$D/scheduler-config.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $D/kube-scheduler.kubeconfig
  qps: $SCHED_QPS
  burst: $SCHED_BURST
leaderElection:
  leaderElect: false
EOF
	# shellcheck disable=SC2054 # commas belong to flag values
	cmd=("$GPUNODE_KUBE_SCHEDULER" --config="$D/scheduler-config.yaml"
		--authentication-kubeconfig="$D/kube-scheduler.kubeconfig"
		--authorization-kubeconfig="$D/kube-scheduler.kubeconfig"
		--bind-address=127.0.0.1 --secure-port="$SCHED_PORT"
		--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics --profiling=false
		"${EXTRA_SCHED[@]}")
}
sched_ready() { curl -skf --max-time 2 "https://127.0.0.1:$SCHED_PORT/healthz" >/dev/null 2>&1; }

cmd_kwok() {
	# HOME is private so no ~/.kwok/kwok.yaml of the user is loaded
	cmd=(env HOME="$D/kwok-home" "$GPUNODE_KWOK" --kubeconfig="$D/admin.kubeconfig"
		--config="$CLUSTER_HERE/kwok-stages.yaml"
		--config="$CLUSTER_HERE/kwok-stages-outcome.yaml"
		--manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake
		--manage-nodes-with-label-selector=
		--cidr=10.0.0.1/16 --node-ip=10.0.0.1
		--node-lease-duration-seconds=40
		--server-address="127.0.0.1:$KWOK_PORT"
		"${EXTRA_KWOK[@]}")
}
kwok_ready() { curl -sf --max-time 2 "http://127.0.0.1:$KWOK_PORT/healthz" >/dev/null 2>&1; }

# default ServiceAccount exists: pods can be created right away
default_sa_ready() {
	curl -sf --max-time 2 --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" \
		"https://127.0.0.1:$API_PORT/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1
}

# GPUNODE_<X>_PORT asks for a fixed port on the first attempt (a port in use is still retried on a free one)
port_or_pick() { # VAR [PORT]
	if [[ -n ${2:-} ]]; then
		[[ $2 =~ ^[0-9]+$ ]] || die "bad port '$2' for $1"
		PICKED+="$2 "
		printf -v "$1" '%s' "$2"
	else
		pick_port "$1"
	fi
}
port_or_pick ETCD_PORT "${GPUNODE_UP_ETCD_PORT:-}"
pick_port ETCD_PEER_PORT
port_or_pick API_PORT "${GPUNODE_UP_API_PORT:-}"
port_or_pick KCM_PORT "${GPUNODE_UP_KCM_PORT:-}"
port_or_pick SCHED_PORT "${GPUNODE_UP_SCHEDULER_PORT:-}"
port_or_pick KWOK_PORT "${GPUNODE_UP_KWOK_PORT:-}"

spawn etcd # starts while the certificates are generated
make_pki
ensure_ready etcd "ETCD_PORT ETCD_PEER_PORT" etcd_ready
spawn kube-apiserver
ensure_ready kube-apiserver "API_PORT" apiserver_ready
write_kubeconfig "$D/admin.kubeconfig" admin
write_kubeconfig "$D/kube-controller-manager.kubeconfig" kube-controller-manager
write_kubeconfig "$D/kube-scheduler.kubeconfig" kube-scheduler
spawn kube-controller-manager
spawn kube-scheduler
spawn kwok
ensure_ready kube-controller-manager "KCM_PORT" kcm_ready
ensure_ready kube-scheduler "SCHED_PORT" sched_ready
ensure_ready kwok "KWOK_PORT" kwok_ready
wait_ready kube-controller-manager default_sa_ready ||
	fail_component kube-controller-manager "did not create the default ServiceAccount within ${TIMEOUT}s"
log "  default ServiceAccount present at +$(elapsed)s"

cp "$D/admin.kubeconfig" "$KUBECONFIG_OUT.tmp" && mv "$KUBECONFIG_OUT.tmp" "$KUBECONFIG_OUT"
{
	for kv in GPUNODE_CLUSTER_NAME="$CLUSTER_NAME" GPUNODE_CLUSTER_DIR="$D" GPUNODE_CLUSTER_KUBECONFIG="$KUBECONFIG_OUT" \
		GPUNODE_API_URL="https://127.0.0.1:$API_PORT" GPUNODE_API_PORT="$API_PORT" \
		GPUNODE_ETCD_URL="http://127.0.0.1:$ETCD_PORT" GPUNODE_KCM_PORT="$KCM_PORT" \
		GPUNODE_SCHEDULER_PORT="$SCHED_PORT" GPUNODE_KWOK_PORT="$KWOK_PORT" GPUNODE_UP_KEY="$UP_KEY"; do
		printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"
	done
	for c in "${COMPONENTS[@]}"; do
		v=${c//-/_}
		printf 'export GPUNODE_PID_%s=%q\n' "${v^^}" "$(comp_pid "$c")"
	done
	printf '%s\n' "$envlines"
} >"$D/cluster.env.tmp"
mv "$D/cluster.env.tmp" "$D/cluster.env"
UP_OK=1
T_END=$(date +%s.%N)
log "$PROG: cluster '$CLUSTER_NAME' ready in $(awk -v a="$T_START" -v b="$T_END" 'BEGIN { printf "%.1f", b - a }')s: $GPUNODE_K8S_VERSION at https://127.0.0.1:$API_PORT"
log "  export KUBECONFIG=$KUBECONFIG_OUT    # stop with: e2e/cluster/down.sh${1:+ $1}"
printf '%s\n' "$KUBECONFIG_OUT"
