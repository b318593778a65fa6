#!/usr/bin/env bash
# A CycloneDX JSON SBOM of each image's binary crate, from Cargo.lock (every crate compiled into
# it, with version, license and checksum): OUT_DIR/operator.cdx.json (gpunode-operator) and
# OUT_DIR/node-probe.cdx.json (gpunode-probe). `make images` writes them into target/images/;
# supply-chain/sbom-test.sh (make lint) checks the generation. cargo-cyclonedx is installed,
# pinned, into ~/.cache/gpunode by supply-chain/tool.sh on first use.
#   supply-chain/sbom.sh OUT_DIR [IMAGE...]     (IMAGE: operator, node-probe; default both)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: supply-chain/sbom.sh OUT_DIR [operator|node-probe...]}
shift
images=("$@")
((${#images[@]})) || images=(operator node-probe)
bin=$(supply-chain/tool.sh cargo-cyclonedx)
mkdir -p "$out"
for image in "${images[@]}"; do
	case $image in
	operator | node-probe) ;;
	*)
		echo "sbom.sh: no image $image (operator, node-probe)" >&2
		exit 2
		;;
	esac
done
# cargo-cyclonedx writes one SBOM next to each workspace member's Cargo.toml: under a name of
# this run's own, the images' moved out, the others removed (whatever happens).
name=gpunode-sbom-$$
members=$(git ls-files -- 'Cargo.toml' '*/Cargo.toml' | xargs -n1 dirname)
cleanup() { for d in $members; do rm -f "$d/$name.json"; done; }
trap cleanup EXIT
# Build dependencies (proc macros, build scripts) are not in the binaries: left out.
PATH=$(dirname "$bin"):$PATH "${CARGO:-cargo}" cyclonedx --manifest-path Cargo.toml -q \
	--format json --spec-version 1.5 --no-build-deps --override-filename "$name" >&2
for image in "${images[@]}"; do
	mv "$image/$name.json" "$out/$image.cdx.json"
	printf '%s\n' "$out/$image.cdx.json"
done
