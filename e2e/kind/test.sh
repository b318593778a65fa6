#!/usr/bin/env bash
# The kind e2e suite, as `make test` runs it: the cluster up (built and cached on first use), the
# scenarios of e2e/tests/kind.rs on it, the cluster down again whatever the outcome.
#
# Where no Docker engine can be installed or started (exit 3 of cluster.sh up) the suite is
# skipped with the reason, loudly; GPUNODE_KIND_REQUIRED=1 makes that a failure. Any other failure
# to bring the cluster up fails the suite.
# Environment: GPUNODE_KIND_KEEP=1 leaves the cluster running afterwards (to look at it, or to run
# the tests again: `GPUNODE_KIND_KUBECONFIG=... cargo test -p gpunode-e2e --features kind --test kind`).
set -euo pipefail
PROG=e2e/kind/test.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$SECONDS
rc=0
kubeconfig=$("$KIND_HERE/cluster.sh" up | tail -n 1) || rc=$?
if ((rc == 3)); then
	log ""
	log "=================================================================================="
	log " kind suite SKIPPED: no Docker engine can run on this machine (reason above)."
	log " The chart's pods, images and kubelet-enforced behaviour were NOT tested."
	log "=================================================================================="
	[[ ${GPUNODE_KIND_REQUIRED:-0} != 1 ]] || exit 1
	exit 0
fi
up_s=$((SECONDS - t0))
if ((rc == 0)); then
	t1=$SECONDS
	GPUNODE_KIND_KUBECONFIG=$kubeconfig GPUNODE_KIND_STATE=$STATE \
		"${CARGO:-cargo}" test -p gpunode-e2e --locked --features kind --test kind -- --test-threads=1 || rc=$?
	test_s=$((SECONDS - t1))
else
	log "$PROG: the kind cluster did not come up (exit $rc)"
	test_s=0
fi
t2=$SECONDS
if [[ ${GPUNODE_KIND_KEEP:-0} != 1 ]]; then
	"$KIND_HERE/cluster.sh" down || rc=1
fi
log "kind suite: cluster up ${up_s}s, tests ${test_s}s, down $((SECONDS - t2))s, total $((SECONDS - t0))s (exit $rc)"
exit "$rc"
