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
KEY="nfd $V $(cat "$TOOL/go.mod" "$TOOL/go.sum" | sha256sum | cut -c1-16) $(go env GOVERSION) $LD"

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
(cd "$TOOL" && go build -buildvcs=false -mod=readonly -trimpath -ldflags "$LD" -o "$TMP/nfd-master" \
	sigs.k8s.io/node-feature-discovery/cmd/nfd-master) >"$CACHE/logs/nfd-build.log" 2>&1 || {
	tail -n 30 "$CACHE/logs/nfd-build.log" >&2
	die "go build of nfd-master failed (log: $CACHE/logs/nfd-build.log)"
}
out=$("$TMP/nfd-master" -version 2>&1) || die "nfd-master -version failed: $out"
[[ $out == *"$V"* ]] || die "nfd-master -version says '$out', expected $V"
printf '%s\n' "$KEY" >"$TMP/.stamp"
mv "$TMP" "$DIR"
trap - EXIT
printf '%s nfd-master %s %ss\n' "$(date -u +%FT%TZ)" "$V" "$((SECONDS - T0))" >>"$CACHE/logs/build-times.log"
log "$PROG: nfd-master $V built in $((SECONDS - T0))s -> $DIR"
printf '%s\n%s\n' "$DIR/nfd-master" "$(moddir)"
