#!/usr/bin/env bash
# Install (or reuse from the cache) one pinned cargo subcommand of the supply-chain checks into
# $GPUNODE_CACHE/tools/<name>-<version>/ (default cache $HOME/.cache/gpunode, which CI keeps), and
# print the path of its binary on stdout. A cold machine builds it from crates.io with
# `cargo install --locked`, once per version.
#   supply-chain/tool.sh cargo-deny        (CARGO_DENY_VERSION, default below)
#   supply-chain/tool.sh cargo-cyclonedx   (CARGO_CYCLONEDX_VERSION, default below)
set -euo pipefail

name=${1:?usage: supply-chain/tool.sh cargo-deny|cargo-cyclonedx}
case $name in
cargo-deny) version=${CARGO_DENY_VERSION:-0.20.2} ;;
cargo-cyclonedx) version=${CARGO_CYCLONEDX_VERSION:-0.5.9} ;;
*)
	echo "tool.sh: unknown tool $name" >&2
	exit 2
	;;
esac
CACHE=${GPUNODE_CACHE:-$HOME/.cache/gpunode}
ROOT=$CACHE/tools/$name-$version
BIN=$ROOT/bin/$name

if [[ ! -x $BIN ]]; then
	printf 'tool.sh: building %s %s into %s\n' "$name" "$version" "$ROOT" >&2
	# Into a temporary root renamed into place, so an interrupted build is never taken for a good one.
	tmp=$ROOT.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$CACHE/tools"
	# Its own target dir: a workspace CARGO_TARGET_DIR must not collect (or clobber) this build.
	CARGO_TARGET_DIR=$tmp/target "${CARGO:-cargo}" install "$name" --version "$version" --locked --root "$tmp" >&2
	rm -rf "$tmp/target"
	rm -rf "$ROOT"
	mv "$tmp" "$ROOT"
fi
printf '%s\n' "$BIN"
