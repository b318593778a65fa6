#!/usr/bin/env bash
# Build (or reuse from the cache) nfd-master, the scale benchmark's peer, from the Go module proxy.
# Not part of `make test`: only `make bench` needs it.
#
# Usage:  bench/nfd-build.sh            prints two lines on stdout: the nfd-master binary and the
#                                       NFD module directory (its CRDs are deployment/base/nfd-crds/)
# The wrapper module e2e/cluster/tools/nfd (go.mod + go.sum committed) pins the version; the binary
# lives in $CACHE/bin/nfd-<version>/nfd-master with a .stamp of the inputs (version, go.mod/go.sum
# hash, ldflags, Go version), like e2e/cluster/build.sh. Progress goes to stderr.
# Environment: GPUNODE_CACHE (default $HOME/.cache/gpunode).
set -euo pipefail
PROG=nfd-build.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOL=$HERE/../e2e/cluster/tools/nfd
CACHE=${GPUNODE_CACHE:-$HOME/.cache/gpunode}
log() { printf '%s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go toolchain not found on PATH (need Go >= 1.26)"
export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOWORK=off CGO_ENABLED=0
V=$(awk '($1 == "sigs.k8s.io/node-feature-discovery" && $2 ~ /^v/) { print $2; exit }' "$TOOL/go.mod")
[[ -n $V ]] || die "cannot read the NFD version from $TOOL/go.mod"
DIR=$CACHE/bin/nfd-$V
LD="-s -w -X sigs.k8s.io/node-feature-discovery/pkg/version.version=$V"
KEY="nfd $V $(cat "$TOOL/go.mod" "$TOOL/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16) $(go env GOVERSION) $LD"

moddir() { (cd "$TOOL" && go mod download -json "sigs.k8s.io/node-feature-discovery" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'); }

mkdir -p "$CACHE/bin" "$CACHE/logs"
exec 9>"$CACHE/.nfd-build.lock"
flock 9
if [[ -f $DIR/.stamp && $(<"$DIR/.stamp") == "$KEY" && -x $DIR/nfd-master ]]; then
	printf '%s\n%s\n' "$DIR/nfd-master" "$(moddir)"
	exit 0
fi
rm -rf "$DIR"
TMP=$DIR.tmp.$$
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
log "$PROG: building nfd-master $V ($(go env GOVERSION)); the first build takes several minutes"
T0=$SECONDS
# The peer at its best needs a client rate limit it does not expose: every nfd-master updater
# builds its client from utils.GetKubeconfig, whose rest.Config keeps client-go's default limiter
# (5 QPS, burst 10 per client). The build copies the module and wraps that one function so the
# environment variables GPUNODE_BENCH_NFD_QPS and GPUNODE_BENCH_NFD_BURST, when set, replace
# the config's QPS and Burst; unset, nfd-master runs exactly as upstream (its defaults).
SRC=$TMP/src
cp -r "$(moddir)" "$SRC"
chmod -R u+w "$SRC"
UTIL=$SRC/pkg/utils/kubernetes.go
grep -q '^func GetKubeconfig(path string) (\*restclient.Config, error) {$' "$UTIL" ||
	die "$UTIL no longer has the GetKubeconfig the QPS wrapper replaces"
sed -i 's/^func GetKubeconfig(path string)/func getKubeconfigUpstream(path string)/' "$UTIL"
cat >"$SRC/pkg/utils/gpunode_bench_qps.go" <<'GO'
package utils

// Written by gpunode's bench/nfd-build.sh: the benchmark's knob for nfd-master's client rate limit.

import (
	"os"
	"strconv"

	restclient "k8s.io/client-go/rest"
)

// GetKubeconfig is upstream's, with QPS and Burst from GPUNODE_BENCH_NFD_QPS and
// GPUNODE_BENCH_NFD_BURST when they are set.
func GetKubeconfig(path string) (*restclient.Config, error) {
	c, err := getKubeconfigUpstream(path)
	if err != nil {
		return nil, err
	}
	if v, e := strconv.ParseFloat(os.Getenv("GPUNODE_BENCH_NFD_QPS"), 32); e == nil {
		c.QPS = float32(v)
	}
	if v, e := strconv.Atoi(os.Getenv("GPUNODE_BENCH_NFD_BURST")); e == nil {
		c.Burst = v
	}
	return c, nil
}
GO
WRAP=$TMP/wrapper
mkdir -p "$WRAP"
cp "$TOOL/go.mod" "$TOOL/go.sum" "$WRAP/"
(cd "$WRAP" && go mod edit -replace "sigs.k8s.io/node-feature-discovery=$SRC" &&
	go build -buildvcs=false -mod=mod -trimpath -ldflags "$LD" -o "$TMP/nfd-master" \
		sigs.k8s.io/node-feature-discovery/cmd/nfd-master) >"$CACHE/logs/nfd-build.log" 2>&1 || {
	tail -n 30 "$CACHE/logs/nfd-build.log" >&2
	die "go build of nfd-master failed (log: $CACHE/logs/nfd-build.log)"
}
rm -rf "$SRC" "$WRAP"
out=$("$TMP/nfd-master" -version 2>&1) || die "nfd-master -version failed: $out"
[[ $out == *"$V"* ]] || die "nfd-master -version says '$out', expected $V"
printf '%s\n' "$KEY" >"$TMP/.stamp"
mv "$TMP" "$DIR"
trap - EXIT
printf '%s nfd-master %s %ss\n' "$(date -u +%FT%TZ)" "$V" "$((SECONDS - T0))" >>"$CACHE/logs/build-times.log"
log "$PROG: nfd-master $V built in $((SECONDS - T0))s -> $DIR"
printf '%s\n%s\n' "$DIR/nfd-master" "$(moddir)"
