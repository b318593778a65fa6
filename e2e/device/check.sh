#!/usr/bin/env bash
# e2e/device/check.sh [OUT_DIR]: the probe against a real NVIDIA GPU. On a machine with the
# driver installed, it runs the probe once (`--once -o json`, the real NVML) and `nvidia-smi -q -x`,
# and prints a table of every field both report: agree, agree within a tolerance (values read at
# another moment: temperatures, power draw, clock-event reasons, the PCIe generation an idle GPU
# trains down to), DIFFER, or not compared (one side does not report it). Both outputs and the
# table are saved in OUT_DIR (default e2e/fixtures/device/<host>), to be committed as a fixture.
# Exit status: 0 when nothing differs, 1 when a field differs, 2 when a step failed.
#
# Nothing is built here: a device machine gets binaries built elsewhere.
#   PROBE      the probe binary (default target/release/gpunode-probe, else target/debug/)
#   COMPARE    the comparison (default target/release/device-compare, else target/debug/)
#   NVML_LIB   the NVML library (default libnvidia-ml.so.1, as the dynamic loader finds it)
#   NVSMI_XML  a recorded `nvidia-smi -q -x` instead of running nvidia-smi (the test here)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$root/e2e/fixtures/device/$(hostname -s)}

built() {
	local name=$1 profile
	for profile in release debug; do
		if [[ -x $root/target/$profile/$name ]]; then
			echo "$root/target/$profile/$name"
			return
		fi
	done
	echo "check.sh: no $name in target/release or target/debug; set ${2}" >&2
	exit 2
}
probe=${PROBE:-$(built gpunode-probe PROBE)}
compare=${COMPARE:-$(built device-compare COMPARE)}
nvml_lib=${NVML_LIB:-libnvidia-ml.so.1}

mkdir -p "$out" || exit 2
if ! "$probe" --once -o json --node-name "${NODE_NAME:-device-check}" --nvml-lib "$nvml_lib" \
	>"$out/probe.json" 2>"$out/probe.log"; then
	echo "check.sh: the probe failed (its log: $out/probe.log)" >&2
	tail -5 "$out/probe.log" >&2
	exit 2
fi
if [[ -n ${NVSMI_XML:-} ]]; then
	cp "$NVSMI_XML" "$out/nvidia-smi.xml" || exit 2
else
	nvidia-smi -q -x >"$out/nvidia-smi.xml" || { echo "check.sh: nvidia-smi -q -x failed" >&2; exit 2; }
	nvidia-smi --version >"$out/nvidia-smi-version.txt" 2>&1 || true
fi
"$compare" "$out/probe.json" "$out/nvidia-smi.xml" >"$out/compare.md"
status=$?
cat "$out/compare.md"
echo "saved: $out/{probe.json,nvidia-smi.xml,compare.md}"
exit "$status"
