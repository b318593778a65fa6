#!/usr/bin/env bash
# cargo deny on the workspace (deny.toml at the repository root): licenses, bans and sources,
# always; advisories only with GPUNODE_DENY_ADVISORIES=1, because they need the RustSec advisory
# database, fetched from GitHub (offline machines have none). cargo-deny is installed, pinned,
# into ~/.cache/gpunode by supply-chain/tool.sh on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(supply-chain/tool.sh cargo-deny)
checks=(licenses bans sources)
if [[ ${GPUNODE_DENY_ADVISORIES:-0} == 1 ]]; then
	checks+=(advisories)
else
	echo "deny.sh: advisories not checked (offline; GPUNODE_DENY_ADVISORIES=1 fetches the RustSec database and checks them)" >&2
fi
PATH=$(dirname "$bin"):$PATH "${CARGO:-cargo}" deny --locked --all-features check "${checks[@]}"
