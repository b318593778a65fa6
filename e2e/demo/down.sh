#!/usr/bin/env bash
# `make demo-down`: stop the demo's probes and operators, then its control plane (state purged).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$ROOT/e2e/demo/lib.sh"
demo_stop_processes
GPUNODE_CLUSTER_NAME=$DEMO_CLUSTER "$ROOT/e2e/cluster/down.sh" --purge
echo "demo stopped"
