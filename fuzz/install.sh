#!/usr/bin/env bash
# Install (or reuse from the cache) cargo-fuzz, the libFuzzer driver of fuzz/run.sh, into
# $GPUNODE_CACHE/bin/cargo-fuzz-<version>/ (default cache $HOME/.cache/gpunode), keyed by version.
# Prints the path of the cargo-fuzz binary on stdout. Needs the nightly toolchain (rustup).
set -euo pipefail

VERSION=${CARGO_FUZZ_VERSION:-0.13.1}
CACHE=${GPUNODE_CACHE:-$HOME/.cache/gpunode}
ROOT=$CACHE/bin/cargo-fuzz-$VERSION
BIN=$ROOT/bin/cargo-fuzz

if [ ! -x "$BIN" ]; then
  printf 'install.sh: building cargo-fuzz %s into %s\n' "$VERSION" "$ROOT" >&2
  # Into a temporary root renamed into place, so an interrupted build is never taken for a good one.
  tmp=$ROOT.tmp.$$
  rm -rf "$tmp"
  # Its own target dir: a workspace CARGO_TARGET_DIR must not collect (or clobber) this build.
  CARGO_TARGET_DIR=$tmp/target cargo install cargo-fuzz --version "$VERSION" --locked --root "$tmp" >&2
  rm -rf "$tmp/target"
  "$tmp/bin/cargo-fuzz" --version >&2
  rm -rf "$ROOT"
  mv "$tmp" "$ROOT"
fi
printf '%s\n' "$BIN"
