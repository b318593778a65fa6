#!/usr/bin/env bash
# Checks that supply-chain/sbom.sh works (make lint, so make test): the node-probe image's SBOM is
# CycloneDX JSON, describes gpunode-probe, and lists a known dependency (nvml-wrapper, at the
# version of Cargo.lock). Builds no image.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sbom=$(supply-chain/sbom.sh "$tmp" node-probe)
fail() {
	echo "sbom-test.sh: $*" >&2
	exit 1
}
# cargo-cyclonedx writes one JSON member per line: read with grep, no JSON tool needed.
grep -q '^  "bomFormat": "CycloneDX",$' "$sbom" || fail "$sbom is not CycloneDX"
grep -A4 '^    "component": {$' "$sbom" | grep -q '^      "name": "gpunode-probe",$' ||
	fail "$sbom does not describe gpunode-probe"
want=$(awk '/^name = "nvml-wrapper"$/ {getline; gsub(/"/, "", $3); print $3}' Cargo.lock)
[[ -n $want ]] || fail "Cargo.lock has no nvml-wrapper"
got=$(grep -A1 '"name": "nvml-wrapper",$' "$sbom" | sed -n 's/^ *"version": "\([^"]*\)",$/\1/p' | head -1)
[[ $got == "$want" ]] || fail "$sbom lists nvml-wrapper ${got:-not at all}, Cargo.lock has $want"
echo "sbom-test.sh: ok: $sbom describes gpunode-probe and lists nvml-wrapper $got" >&2
