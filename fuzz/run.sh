#!/usr/bin/env bash
# Build every libFuzzer target of fuzz/ (cargo-fuzz, nightly) and run each for SECONDS
# (-max_total_time), starting from the committed seeds in fuzz/corpus/<target>/ (read only: new
# inputs go to a scratch corpus under fuzz/work/). Writes one reliability result row per target
# into ${GPUNODE_RELIABILITY_DIR:-target/tmp/reliability}/cargofuzz-<target>.json (the format of
# e2e/src/faults/record.rs Results: the commit and the runs). Exits non-zero when a target crashed (its input is in fuzz/artifacts/)
# or could not be built or run.
#
# Usage: fuzz/run.sh SECONDS [TARGET...]     (default: every target)
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SECONDS_EACH=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(dcb version_range duration report)
OUT=${GPUNODE_RELIABILITY_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/tmp/reliability}
# The fuzz build has its own target dir: nightly and sanitizer flags must not invalidate the
# workspace's (stable) build.
export CARGO_TARGET_DIR=${GPUNODE_FUZZ_TARGET_DIR:-$HERE/target}
mkdir -p "$OUT"

CARGO_FUZZ=$("$HERE/install.sh") || { echo "run.sh: cargo-fuzz could not be installed" >&2; exit 1; }

# Safe Rust: the failures to find are panics (assertions, indexing, overflow), which libFuzzer
# catches without AddressSanitizer; --sanitizer none keeps the build and each execution fast.
# Debug assertions stay on (-a), so arithmetic overflow panics too.
fuzz() { (cd "$HERE" && PATH="$(dirname "$CARGO_FUZZ"):$PATH" cargo +nightly fuzz "$@"); }

# The commit the fuzzed code is at, as gpunode_testkit::source_commit names it.
COMMIT=$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
if [ "$COMMIT" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- . ':!docs')" ]; then
  COMMIT="$COMMIT (with uncommitted changes)"
fi

# A row for the reliability report: the fault, then (invariant, ok, detail) triples.
row() {
  local target=$1 fault=$2; shift 2
  python3 - "$OUT/cargofuzz-$target.json" "$COMMIT" "$fault" "$@" <<'PY'
import json, sys
path, commit, fault, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
checks = [{"invariant": rest[i], "ok": rest[i + 1] == "true", "detail": rest[i + 2]}
          for i in range(0, len(rest), 3)]
json.dump({"commit": commit, "runs": [{"class": "bad input (fuzz)", "fault": fault, "seed": None,
            "checks": checks, "recovery": None}]}, open(path, "w"))
PY
}

if ! fuzz build -O -a --sanitizer none >&2; then
  for t in "${TARGETS[@]}"; do
    row "$t" "libFuzzer: $t (not built)" "no crash or failed property" false "cargo fuzz build failed"
  done
  exit 1
fi

status=0
for t in "${TARGETS[@]}"; do
  seeds=$HERE/corpus/$t
  work=$HERE/work/$t
  artifacts=$HERE/artifacts/$t
  log=$HERE/work/$t.log
  rm -rf "$work" "$artifacts"
  mkdir -p "$work" "$artifacts"
  # -timeout: an input running past 10 s is a hang and counts as a crash; -rss_limit_mb likewise.
  fuzz run -O -a --sanitizer none "$t" "$work" "$seeds" -- \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  # libFuzzer's own count of the corpus it ended with (seeds and what it added), else the files.
  corpus=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  [ -n "$corpus" ] || corpus=$(find "$work" "$seeds" -type f | wc -l)
  crash=$(find "$artifacts" -type f | head -1)
  fault="libFuzzer: $t (${execs:-0} executions, corpus $corpus inputs)"
  if [ "$rc" -eq 0 ] && [ -z "$crash" ] && [ "${execs:-0}" -gt 0 ]; then
    row "$t" "$fault" "no crash or failed property" true "${SECONDS_EACH} s from $(find "$seeds" -type f | wc -l) seeds"
  else
    detail="exit $rc"
    [ -n "$crash" ] && detail="crash: ${crash#"$ROOT"/} ($(grep -m1 -E 'panicked at|ERROR: libFuzzer' "$log" | head -c 300))"
    row "$t" "$fault" "no crash or failed property" false "$detail"
    echo "run.sh: $t failed: $detail (log: $log)" >&2
    status=1
  fi
  printf '%-14s %s\n' "$t" "$fault" >&2
done
exit $status
