#!/usr/bin/env bash
# Build (or reuse from the cache) the binaries of the local control plane:
#   kubernetes  kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, and kubelet, kubeadm,
#               kube-proxy for the kind nodes of e2e/kind  (k8s.io/kubernetes, ONE go build)
#   etcd        go.etcd.io/etcd/server/v3
#   kwok        sigs.k8s.io/kwok/cmd/kwok
#   promtool    github.com/prometheus/prometheus/cmd/promtool (the chart's alert tests, e2e/tests/alerts.rs)
#   helm        helm.sh/helm/v3/cmd/helm (default kube version = the Kubernetes minor built here)
#   toxiproxy   github.com/Shopify/toxiproxy/v2 cmd/server and cmd/cli (the API latency fault of the
#               reliability suite, e2e/tests/reliability_latency.rs)
#   kind        sigs.k8s.io/kind           } only for the kind cluster of e2e/kind, built when named:
#   coredns     github.com/coredns/coredns } build.sh kind coredns
#
# Every component is built from a Go wrapper module under e2e/cluster/tools/<name>/ whose go.mod and
# go.sum are committed, so the build is pinned. The Kubernetes version is one variable, K8S_VERSION:
# for the committed version tools/k8s is used as is; any other version gets a wrapper generated from
# k8s.io/kubernetes@$K8S_VERSION's own go.mod under $CACHE/wrappers/.
#
# Usage:
#   build.sh [COMPONENT...]     build what is missing (default: kubernetes etcd kwok helm promtool toxiproxy); stdout stays empty
#   build.sh --print-env        print `export GPUNODE_...=` lines for the built binaries (fails if not built)
#   build.sh --regen            regenerate the committed tools/k8s/go.mod+go.sum for K8S_VERSION and
#                               e2e/cluster/kwok-stages.yaml from the kwok module (maintainers only)
#   build.sh --help
#
# Environment:
#   K8S_VERSION     Kubernetes version to build (default: the one tools/k8s/go.mod pins, v1.37.2)
#   GPUNODE_CACHE   cache root (default $HOME/.cache/gpunode): bin/<component>-<version>/, go/mod, go/build, logs/
#
# Cache layout: $CACHE/bin/k8s-v1.37.2/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kubelet,...},
# $CACHE/bin/etcd-v3.6.16/etcd, $CACHE/bin/kwok-v0.8.0/kwok, $CACHE/bin/helm-v3.22.0-kube1.37/helm and
# $CACHE/bin/set-k8s-v1.37.2/ (symlinks to all of them: GPUNODE_BIN_DIR). A directory counts only when
# its .stamp matches the inputs (versions, go.mod/go.sum hash, ldflags, Go version); anything else is
# deleted and rebuilt into a temporary directory that is renamed into place after every binary of the
# set passed its --version check. promtool: $CACHE/bin/promtool-v3.16.0/promtool (Prometheus 3.16.0 is
# the Go module version v0.316.0), not part of the set; toxiproxy: $CACHE/bin/toxiproxy-v2.12.0/{toxiproxy-server,toxiproxy-cli}, not part of the set.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS=$HERE/tools
CACHE=${GPUNODE_CACHE:-$HOME/.cache/gpunode}
PROG=build.sh

log() { printf '%s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------------
# Versions: all but Kubernetes come from the committed wrapper go.mod files (single source of truth).
modver() { # FILE MODULE -> version required in FILE
	awk -v m="$2" '($1 == m && $2 ~ /^v/) || ($1 == "require" && $2 == m) { print ($1 == "require") ? $3 : $2; exit }' "$1"
}
DEFAULT_K8S_VERSION=$(modver "$TOOLS/k8s/go.mod" k8s.io/kubernetes)
K8S_VERSION=${K8S_VERSION:-$DEFAULT_K8S_VERSION}
ETCD_VERSION=$(modver "$TOOLS/etcd/go.mod" go.etcd.io/etcd/server/v3)
KWOK_VERSION=$(modver "$TOOLS/kwok/go.mod" sigs.k8s.io/kwok)
# Prometheus 3.X.Y is tagged v0.3XX.Y as a Go module: the release promtool reports is derived from it.
PROMTOOL_MODVERSION=$(modver "$TOOLS/promtool/go.mod" github.com/prometheus/prometheus)
[[ $PROMTOOL_MODVERSION =~ ^v0\.([1-9])([0-9][0-9])\.([0-9]+)$ ]] ||
	die "tools/promtool/go.mod: github.com/prometheus/prometheus $PROMTOOL_MODVERSION is not a v0.3XX.Y (Prometheus 3.x) version"
PROMTOOL_VERSION=v${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}
HELM_VERSION=$(modver "$TOOLS/helm/go.mod" helm.sh/helm/v3)
TOXIPROXY_VERSION=$(modver "$TOOLS/toxiproxy/go.mod" github.com/Shopify/toxiproxy/v2)
# The kind cluster of e2e/kind only (not in the default set): kind itself and the cluster DNS.
KIND_VERSION=$(modver "$TOOLS/kind/go.mod" sigs.k8s.io/kind)
COREDNS_VERSION=$(modver "$TOOLS/coredns/go.mod" github.com/coredns/coredns)
[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.37.2 (got '$K8S_VERSION')"
K8S_MINOR=${BASH_REMATCH[1]}

K8S_DIR=$CACHE/bin/k8s-$K8S_VERSION
# The control plane's binaries, kubectl, and the node binaries of the kind cluster (e2e/kind): one
# go build, so the packages they share compile once.
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kubeadm kube-proxy)
ETCD_DIR=$CACHE/bin/etcd-$ETCD_VERSION
KWOK_DIR=$CACHE/bin/kwok-$KWOK_VERSION
HELM_DIR=$CACHE/bin/helm-$HELM_VERSION-kube1.$K8S_MINOR
PROMTOOL_DIR=$CACHE/bin/promtool-$PROMTOOL_VERSION
TOXIPROXY_DIR=$CACHE/bin/toxiproxy-$TOXIPROXY_VERSION
SET_DIR=$CACHE/bin/set-k8s-$K8S_VERSION
KIND_DIR=$CACHE/bin/kind-$KIND_VERSION
COREDNS_DIR=$CACHE/bin/coredns-$COREDNS_VERSION

# ---------------------------------------------------------------------------------------------------
print_env() {
	local d missing=()
	for d in "$K8S_DIR" "$ETCD_DIR" "$KWOK_DIR" "$HELM_DIR" "$PROMTOOL_DIR"; do
		[[ -f $d/.stamp ]] || missing+=("$d")
	done
	[[ -d $SET_DIR ]] || missing+=("$SET_DIR")
	if ((${#missing[@]})); then
		die "not built: ${missing[*]} (run e2e/cluster/build.sh or make cluster-build)"
	fi
	local k v
	for k in GPUNODE_CACHE=$CACHE GPUNODE_K8S_VERSION=$K8S_VERSION GPUNODE_ETCD_VERSION=$ETCD_VERSION \
		GPUNODE_KWOK_VERSION=$KWOK_VERSION GPUNODE_HELM_VERSION=$HELM_VERSION GPUNODE_BIN_DIR=$SET_DIR \
		GPUNODE_ETCD=$ETCD_DIR/etcd GPUNODE_KUBE_APISERVER=$K8S_DIR/kube-apiserver \
		GPUNODE_KUBE_CONTROLLER_MANAGER=$K8S_DIR/kube-controller-manager \
		GPUNODE_KUBE_SCHEDULER=$K8S_DIR/kube-scheduler GPUNODE_KUBECTL=$K8S_DIR/kubectl \
		GPUNODE_KWOK=$KWOK_DIR/kwok GPUNODE_HELM=$HELM_DIR/helm \
		GPUNODE_PROMTOOL_VERSION=$PROMTOOL_VERSION GPUNODE_PROMTOOL=$PROMTOOL_DIR/promtool; do
		v=${k#*=}
		printf 'export %s=%q\n' "${k%%=*}" "$v"
	done
	# Built only for the fault suite's latency proxy and the kind cluster: exported when present.
	[[ ! -f $TOXIPROXY_DIR/.stamp ]] || printf 'export GPUNODE_TOXIPROXY_SERVER=%q\nexport GPUNODE_TOXIPROXY_CLI=%q\n' \
		"$TOXIPROXY_DIR/toxiproxy-server" "$TOXIPROXY_DIR/toxiproxy-cli"
	[[ ! -f $KIND_DIR/.stamp ]] || printf 'export GPUNODE_KIND=%q\n' "$KIND_DIR/kind"
	[[ ! -f $COREDNS_DIR/.stamp ]] || printf 'export GPUNODE_COREDNS=%q\nexport GPUNODE_COREDNS_VERSION=%q\n' \
		"$COREDNS_DIR/coredns" "$COREDNS_VERSION"
}

case "${1:-}" in
--print-env) print_env; exit 0 ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 0 ;;
esac

# ---------------------------------------------------------------------------------------------------
# Go environment: module and build caches live under $CACHE/go so repeated builds on this machine are warm.
command -v go >/dev/null 2>&1 ||
	die "Go toolchain not found on PATH: install Go >= 1.26 (https://go.dev/dl/) and re-run; nothing was built"
export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOWORK=off CGO_ENABLED=0
GO_VERSION=$(go env GOVERSION 2>/dev/null) || die "'go env GOVERSION' failed: is the Go toolchain on PATH working?"
if ! [[ $GO_VERSION =~ ^go1\.([0-9]+) ]] || ((BASH_REMATCH[1] < 24)); then
	die "Go $GO_VERSION is too old: need >= go1.24 (tool directives; the modules themselves need go1.26)"
fi
mkdir -p "$CACHE/bin" "$CACHE/logs" "$CACHE/wrappers"

BUILD_GOFLAGS="-buildvcs=false -mod=readonly -trimpath"
# tags as in kubernetes' hack/lib/golang.sh for non-debug builds
K8S_TAGS=selinux,notest,grpcnotrace

mem_avail_kib() { awk '/^MemAvailable:/ { print $2; exit }' /proc/meminfo 2>/dev/null || echo 0; }

# run_long COMPONENT STEP LOG CMD... : run a long step with its output in LOG, print progress every
# 30 s, and record elapsed time, the largest process RSS (/usr/bin/time -v) and the peak drop of
# MemAvailable (all of go's compile/link processes together).
STEP_SECONDS=0 STEP_MAXRSS_MIB="?" STEP_SYSMEM_MIB="?"
run_long() {
	local comp=$1 step=$2 logf=$3
	shift 3
	local start=$SECONDS last=$SECONDS base avail min rc=0 pid
	base=$(mem_avail_kib)
	min=$base
	if [[ -x /usr/bin/time ]]; then
		/usr/bin/time -v -o "$logf.time" "$@" >"$logf" 2>&1 &
	else
		"$@" >"$logf" 2>&1 &
	fi
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1 # poll interval
		avail=$(mem_avail_kib)
		((avail < min)) && min=$avail
		if ((SECONDS - last >= 30)); then
			last=$SECONDS
			log "  ... $comp: $step running for $((SECONDS - start))s ($(grep -cv '^\(go: \|#\)' "$logf" 2>/dev/null || true) packages compiled so far, $(((base - min) / 1024)) MiB peak memory)"
		fi
	done
	wait "$pid" || rc=$?
	STEP_SECONDS=$((SECONDS - start))
	STEP_SYSMEM_MIB=$(((base - min) / 1024))
	STEP_MAXRSS_MIB="?"
	if [[ -f $logf.time ]]; then
		STEP_MAXRSS_MIB=$(awk -F': ' '/Maximum resident set size/ { printf "%d", $2 / 1024 }' "$logf.time")
	fi
	if ((rc != 0)); then
		log "---- last 30 lines of $logf ----"
		tail -n 30 "$logf" | grep -v '^\s*Command being timed' >&2 || true
		die "$step failed for $comp (exit $rc, after ${STEP_SECONDS}s; full log: $logf)"
	fi
}

# run_step COMPONENT STEP CMD... : a short step; its output is shown only on failure.
run_step() {
	local comp=$1 step=$2 out rc=0
	shift 2
	out=$("$@" 2>&1) || rc=$?
	if ((rc != 0)); then
		printf '%s\n' "$out" | tail -n 30 >&2
		die "$step failed for $comp (exit $rc)"
	fi
}

hash_files() { cat "$@" | sha256sum | cut -c1-16; }

stamp_ok() { # DIR KEY BINARIES...
	local dir=$1 key=$2 b
	shift 2
	[[ -f $dir/.stamp && "$(cat "$dir/.stamp")" == "$key" ]] || return 1
	for b; do [[ -x $dir/$b ]] || return 1; done
}

record_time() { # COMPONENT VERSION
	printf '%s %s %s seconds=%s largest_process_rss_mib=%s system_peak_mib=%s go=%s\n' "$(date -u +%FT%TZ)" \
		"$1" "$2" "$STEP_SECONDS" "$STEP_MAXRSS_MIB" "$STEP_SYSMEM_MIB" "$GO_VERSION" >>"$CACHE/logs/build-times.log"
}

# check_version COMPONENT BINARY EXPECTED-SUBSTRING ARGS...
check_version() {
	local comp=$1 bin=$2 want=$3 out
	shift 3
	out=$("$bin" "$@" 2>&1) || die "'$(basename "$bin") $*' failed for $comp: $out"
	[[ $out == *"$want"* ]] || die "version check failed for $comp: '$(basename "$bin") $*' printed '$out', expected '$want'"
	log "  $(basename "$bin"): $(printf '%s' "$out" | head -n 1)"
}

# prepare TARGET-DIR: start a fresh temporary build directory next to it
prepare_tmp() {
	local dir=$1
	rm -rf "$dir" "$dir".tmp.*
	mkdir -p "$dir.tmp.$$"
	printf '%s' "$dir.tmp.$$"
}
finish_tmp() { # TMP DIR KEY
	printf '%s' "$3" >"$1/.stamp"
	mv "$1" "$2"
	CUR_TMP=
}
# a failed or interrupted build leaves no temporary directory behind
CUR_TMP=
trap '[[ -z $CUR_TMP ]] || rm -rf "$CUR_TMP"' EXIT

# ---------------------------------------------------------------------------------------------------
# Kubernetes wrapper module. For the committed version: tools/k8s. Otherwise generate one from
# k8s.io/kubernetes@V's own go.mod: its go/godebug lines, and every `k8s.io/X => ./staging/src/k8s.io/X`
# replace turned into `k8s.io/X => k8s.io/X v0.MINOR.PATCH` (the staging tag of that release).
gen_k8s_wrapper() { # VERSION DIR COMPONENT-LABEL
	local v=$1 dir=$2 comp=$3 json gomod minor patch
	[[ $v =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "bad Kubernetes version $v"
	minor=${BASH_REMATCH[1]} patch=${BASH_REMATCH[2]}
	log "  generating the wrapper go.mod for k8s.io/kubernetes $v in $dir"
	json=$(cd "$CACHE/wrappers" && go mod download -json "k8s.io/kubernetes@$v" 2>&1) ||
		{ printf '%s\n' "$json" | tail -n 20 >&2; die "go mod download failed for $comp (k8s.io/kubernetes@$v)"; }
	gomod=$(printf '%s\n' "$json" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[[ -f $gomod ]] || die "go mod download printed no GoMod file for $comp (k8s.io/kubernetes@$v)"
	mkdir -p "$dir"
	{
		printf '// Generated by e2e/cluster/build.sh from the go.mod of k8s.io/kubernetes@%s: go/godebug lines\n' "$v"
		printf '// mirrored, every ./staging/src/k8s.io/X replace pinned to k8s.io/X v0.%s.%s. Do not edit; run\n' "$minor" "$patch"
		printf '// %s instead.\n' "\`K8S_VERSION=$v e2e/cluster/build.sh --regen\`"
		printf 'module gpunode.local/k8sbins\n\n'
		awk '/^go [0-9]/ { print; next }
		     /^godebug \(/ { inblk = 1 }
		     inblk { print; if ($0 ~ /^\)/) inblk = 0; next }
		     /^godebug / { print }' "$gomod"
		printf '\ntool (\n'
		printf '\tk8s.io/kubernetes/cmd/%s\n' "${K8S_BINS[@]}"
		printf ')\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$v"
		awk -v ver="v0.$minor.$patch" '$2 == "=>" && $3 ~ /^\.\/staging\/src\/k8s\.io\// { print "\t" $1 " => " $1 " " ver }' "$gomod"
		printf ')\n'
	} >"$dir/go.mod"
	grep -q '=> k8s.io/api ' "$dir/go.mod" ||
		die "could not derive the staging replace block for $comp from $gomod"
	rm -f "$dir/go.sum"
	log "  go mod tidy for $comp (resolves the full dependency graph; can take a minute)"
	run_long "$comp" "go mod tidy" "$CACHE/logs/tidy-k8s-$v.log" bash -c "cd '$dir' && go mod tidy"
}

build_k8s() {
	local v=$K8S_VERSION comp="kubernetes $K8S_VERSION (${K8S_BINS[*]})"
	local wdir ld kv key tmp bins=("${K8S_BINS[@]}")
	if [[ $v == "$DEFAULT_K8S_VERSION" ]]; then
		wdir=$TOOLS/k8s
	else
		wdir=$CACHE/wrappers/k8s-$v
		[[ -f $wdir/go.sum && -f $wdir/go.mod ]] || gen_k8s_wrapper "$v" "$wdir" "$comp"
	fi
	ld="-s -w"
	for kv in gitVersion=$v gitMajor=1 gitMinor=$K8S_MINOR gitTreeState=clean \
		gitCommit=0000000000000000000000000000000000000000; do
		ld+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
	done
	key="k8s $v go=$GO_VERSION mod=$(hash_files "$wdir/go.mod" "$wdir/go.sum") tags=$K8S_TAGS ld=$ld"
	if stamp_ok "$K8S_DIR" "$key" "${bins[@]}"; then
		log "kubernetes $v: cached in $K8S_DIR"
		return
	fi
	log "kubernetes $v: building ${bins[*]} (one go build, the long pole: ~12 min cold on 2 cores)"
	tmp=$(prepare_tmp "$K8S_DIR")
	CUR_TMP=$tmp
	local t0=$SECONDS
	run_long "$comp" "go mod download" "$CACHE/logs/download-k8s-$v.log" bash -c "cd '$wdir' && go mod download"
	log "  go mod download: ${STEP_SECONDS}s"
	ld+=" -X k8s.io/component-base/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	ld+=" -X k8s.io/client-go/pkg/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	# shellcheck disable=SC2086 # BUILD_GOFLAGS is a list of flags
	run_long "$comp" "go build" "$CACHE/logs/build-k8s-$v.log" \
		env -C "$wdir" go build -v $BUILD_GOFLAGS -tags "$K8S_TAGS" -ldflags "$ld" -o "$tmp/" \
		"${bins[@]/#/k8s.io/kubernetes/cmd/}"
	record_time kubernetes "$v"
	log "  go build: ${STEP_SECONDS}s, largest process ${STEP_MAXRSS_MIB} MiB, system peak ${STEP_SYSMEM_MIB} MiB"
	local b
	for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
		check_version "$comp" "$tmp/$b" "Kubernetes $v" --version
	done
	check_version "$comp" "$tmp/kubectl" "$v" version --client
	check_version "$comp" "$tmp/kubeadm" "$v" version -o short
	finish_tmp "$tmp" "$K8S_DIR" "$key"
	log "kubernetes $v: done in $((SECONDS - t0))s -> $K8S_DIR"
}

# generic wrapper build: COMPONENT VERSION WRAPPER-DIR TARGET-DIR LDFLAGS OUT-NAME PACKAGE
build_simple() {
	local name=$1 v=$2 wdir=$3 dir=$4 ld=$5 out=$6 pkg=$7 comp key tmp t0=$SECONDS
	comp="$name $v"
	key="$name $v go=$GO_VERSION mod=$(hash_files "$wdir/go.mod" "$wdir/go.sum") ld=$ld"
	BUILT_TMP=
	if stamp_ok "$dir" "$key" "$out"; then
		log "$name $v: cached in $dir"
		return 0
	fi
	log "$name $v: building $pkg"
	tmp=$(prepare_tmp "$dir")
	CUR_TMP=$tmp
	run_long "$comp" "go mod download" "$CACHE/logs/download-$name-$v.log" bash -c "cd '$wdir' && go mod download"
	log "  go mod download: ${STEP_SECONDS}s"
	# shellcheck disable=SC2086 # BUILD_GOFLAGS is a list of flags
	run_long "$comp" "go build" "$CACHE/logs/build-$name-$v.log" \
		env -C "$wdir" go build -v $BUILD_GOFLAGS -ldflags "$ld" -o "$tmp/$out" "$pkg"
	record_time "$name" "$v"
	log "  go build: ${STEP_SECONDS}s, largest process ${STEP_MAXRSS_MIB} MiB, system peak ${STEP_SYSMEM_MIB} MiB"
	BUILT_TMP=$tmp BUILT_KEY=$key BUILT_T0=$t0
}

build_toxiproxy() {
	local v=$TOXIPROXY_VERSION ld
	ld="-s -w -X github.com/Shopify/toxiproxy/v2.Version=${v#v}"
	build_simple toxiproxy "$v" "$TOOLS/toxiproxy" "$TOXIPROXY_DIR" "$ld" toxiproxy-server \
		github.com/Shopify/toxiproxy/v2/cmd/server
	[[ -n $BUILT_TMP ]] || return 0
	# shellcheck disable=SC2086 # BUILD_GOFLAGS is a list of flags
	run_long "toxiproxy $v" "go build cli" "$CACHE/logs/build-toxiproxy-cli-$v.log" \
		env -C "$TOOLS/toxiproxy" go build -v $BUILD_GOFLAGS -ldflags "$ld" -o "$BUILT_TMP/toxiproxy-cli" \
		github.com/Shopify/toxiproxy/v2/cmd/cli
	check_version "toxiproxy $v" "$BUILT_TMP/toxiproxy-server" "toxiproxy-server version ${v#v}" -version
	finish_tmp "$BUILT_TMP" "$TOXIPROXY_DIR" "$BUILT_KEY"
	log "toxiproxy $v: done in $((SECONDS - BUILT_T0))s -> $TOXIPROXY_DIR"
}

build_etcd() {
	local v=$ETCD_VERSION
	build_simple etcd "$v" "$TOOLS/etcd" "$ETCD_DIR" \
		"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$v" etcd go.etcd.io/etcd/server/v3
	[[ -n $BUILT_TMP ]] || return 0
	check_version "etcd $v" "$BUILT_TMP/etcd" "etcd Version: ${v#v}" --version
	finish_tmp "$BUILT_TMP" "$ETCD_DIR" "$BUILT_KEY"
	log "etcd $v: done in $((SECONDS - BUILT_T0))s -> $ETCD_DIR"
}

build_kwok() {
	local v=$KWOK_VERSION
	build_simple kwok "$v" "$TOOLS/kwok" "$KWOK_DIR" \
		"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" kwok sigs.k8s.io/kwok/cmd/kwok
	[[ -n $BUILT_TMP ]] || return 0
	check_version "kwok $v" "$BUILT_TMP/kwok" "$v" --version
	finish_tmp "$BUILT_TMP" "$KWOK_DIR" "$BUILT_KEY"
	log "kwok $v: done in $((SECONDS - BUILT_T0))s -> $KWOK_DIR"
}

build_promtool() {
	local v=$PROMTOOL_VERSION p=github.com/prometheus/common/version ld
	# What Prometheus's own release build (promu) sets, so `promtool --version` names the release;
	# the revision is the module version (the module zip carries no commit).
	ld="-s -w -X $p.Version=${v#v} -X $p.Revision=$PROMTOOL_MODVERSION -X $p.Branch=HEAD"
	ld+=" -X $p.BuildUser=gpunode-build.sh"
	build_simple promtool "$v" "$TOOLS/promtool" "$PROMTOOL_DIR" "$ld" promtool \
		github.com/prometheus/prometheus/cmd/promtool
	[[ -n $BUILT_TMP ]] || return 0
	check_version "promtool $v" "$BUILT_TMP/promtool" "promtool, version ${v#v} (branch: HEAD, revision: $PROMTOOL_MODVERSION)" --version
	finish_tmp "$BUILT_TMP" "$PROMTOOL_DIR" "$BUILT_KEY"
	log "promtool $v: done in $((SECONDS - BUILT_T0))s -> $PROMTOOL_DIR"
}

build_helm() {
	local v=$HELM_VERSION p=helm.sh/helm/v3 ld chart out
	ld="-s -w -X $p/internal/version.version=$v -X $p/internal/version.gitTreeState=clean"
	ld+=" -X $p/pkg/chartutil.k8sVersionMajor=1 -X $p/pkg/chartutil.k8sVersionMinor=$K8S_MINOR"
	ld+=" -X $p/pkg/lint/rules.k8sVersionMajor=1 -X $p/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR"
	build_simple helm "$v" "$TOOLS/helm" "$HELM_DIR" "$ld" helm "$p/cmd/helm"
	[[ -n $BUILT_TMP ]] || return 0
	check_version "helm $v" "$BUILT_TMP/helm" "$v" version --short
	# -X on a missing symbol is silently ignored: check the compiled-in default kube version.
	chart=$(mktemp -d)
	mkdir -p "$chart/c/templates"
	printf 'apiVersion: v2\nname: c\nversion: 0.1.0\n' >"$chart/c/Chart.yaml"
	printf 'kube: {{ .Capabilities.KubeVersion.Version }}\n' >"$chart/c/templates/k.yaml"
	out=$(HELM_CACHE_HOME=$chart HELM_CONFIG_HOME=$chart HELM_DATA_HOME=$chart "$BUILT_TMP/helm" template "$chart/c" 2>&1) ||
		die "helm template failed for helm $v: $out"
	rm -rf "$chart"
	[[ $out == *"kube: v1.$K8S_MINOR.0"* ]] ||
		die "version check failed for helm $v: default kube version is not v1.$K8S_MINOR.0: $out"
	log "  helm template: .Capabilities.KubeVersion = v1.$K8S_MINOR.0"
	finish_tmp "$BUILT_TMP" "$HELM_DIR" "$BUILT_KEY"
	log "helm $v: done in $((SECONDS - BUILT_T0))s -> $HELM_DIR"
}

build_kind() {
	local v=$KIND_VERSION
	build_simple kind "$v" "$TOOLS/kind" "$KIND_DIR" "-s -w" kind sigs.k8s.io/kind
	[[ -n $BUILT_TMP ]] || return 0
	check_version "kind $v" "$BUILT_TMP/kind" "kind $v" version
	finish_tmp "$BUILT_TMP" "$KIND_DIR" "$BUILT_KEY"
	log "kind $v: done in $((SECONDS - BUILT_T0))s -> $KIND_DIR"
}

build_coredns() {
	local v=$COREDNS_VERSION
	build_simple coredns "$v" "$TOOLS/coredns" "$COREDNS_DIR" "-s -w" coredns github.com/coredns/coredns
	[[ -n $BUILT_TMP ]] || return 0
	check_version "coredns $v" "$BUILT_TMP/coredns" "CoreDNS-${v#v}" -version
	finish_tmp "$BUILT_TMP" "$COREDNS_DIR" "$BUILT_KEY"
	log "coredns $v: done in $((SECONDS - BUILT_T0))s -> $COREDNS_DIR"
}

link_set() {
	local tmp=$SET_DIR.tmp.$$ b ok=1 bins=("$K8S_DIR"/kube-apiserver "$K8S_DIR"/kube-controller-manager
		"$K8S_DIR"/kube-scheduler "$K8S_DIR"/kubectl "$ETCD_DIR"/etcd "$KWOK_DIR"/kwok "$HELM_DIR"/helm)
	for b in "${bins[@]}"; do
		[[ $(readlink "$SET_DIR/${b##*/}" 2>/dev/null) == "$b" ]] || ok=0
	done
	((ok)) && return 0
	rm -rf "$tmp"
	mkdir -p "$tmp"
	for b in "${bins[@]}"; do ln -s "$b" "$tmp/"; done
	rm -rf "$SET_DIR"
	mv "$tmp" "$SET_DIR"
}

regen() {
	local comp="kubernetes $K8S_VERSION" tmp
	tmp=$CACHE/wrappers/regen-$$
	gen_k8s_wrapper "$K8S_VERSION" "$tmp" "$comp"
	cp "$tmp/go.mod" "$tmp/go.sum" "$TOOLS/k8s/"
	rm -rf "$tmp"
	log "wrote $TOOLS/k8s/go.mod and go.sum for $K8S_VERSION"
	local kdir
	kdir=$(cd "$TOOLS/kwok" && go mod download -json sigs.k8s.io/kwok | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d $kdir ]] || die "go mod download failed for kwok $KWOK_VERSION"
	{
		printf '# Default kwok stages, concatenated from sigs.k8s.io/kwok@%s/kustomize/stage by\n' "$KWOK_VERSION"
		printf '# %s. kwok >= 0.8 has no implicit stages (pass this with --config).\n' "\`e2e/cluster/build.sh --regen\`"
		printf '# One change: pod-complete skips pods labelled gpunode.test/outcome (kwok-stages-outcome.yaml).\n'
		local f first=1
		for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
			pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
			[[ -f $kdir/kustomize/stage/$f ]] || die "kwok $KWOK_VERSION has no kustomize/stage/$f"
			((first)) || printf -- '---\n'
			first=0
			printf '# kustomize/stage/%s\n' "$f"
			# pod-complete leaves pods labelled gpunode.test/outcome to kwok-stages-outcome.yaml.
			sed -e '/^---$/d' "$kdir/kustomize/stage/$f" | awk -v f="$f" '
				{ print }
				f ~ /pod-complete/ && /^      - .Job.$/ {
					print "    - key: '"'"'.metadata.labels[\"gpunode.test/outcome\"]'"'"'"
					print "      operator: '"'"'DoesNotExist'"'"'"
				}'
		done
	} >"$HERE/kwok-stages.yaml"
	log "wrote $HERE/kwok-stages.yaml"
}

# ---------------------------------------------------------------------------------------------------
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
	log "$PROG: another build.sh is running on $CACHE; waiting for it"
	flock 9
fi

if [[ ${1:-} == --regen ]]; then
	regen
	exit 0
fi

comps=("$@")
((${#comps[@]})) || comps=(kubernetes etcd kwok helm promtool toxiproxy)
T0=$SECONDS
log "$PROG: $GO_VERSION, cache $CACHE, kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION, promtool $PROMTOOL_VERSION"
for c in "${comps[@]}"; do
	case $c in
	kubernetes | k8s) build_k8s ;;
	etcd) build_etcd ;;
	kwok) build_kwok ;;
	promtool) build_promtool ;;
	toxiproxy) build_toxiproxy ;;
	helm) build_helm ;;
	kind) build_kind ;;
	coredns) build_coredns ;;
	*) die "unknown component '$c' (expected: kubernetes etcd kwok helm promtool toxiproxy kind coredns)" ;;
	esac
done
if [[ -f $K8S_DIR/.stamp && -f $ETCD_DIR/.stamp && -f $KWOK_DIR/.stamp && -f $HELM_DIR/.stamp ]]; then
	link_set
	log "$PROG: all binaries ready in $SET_DIR ($((SECONDS - T0))s)"
fi
