#!/usr/bin/env bash
# Host tools the reliability suite uses beyond the control plane, from Debian's packages:
#   faketime  libfaketime, which skews one operator replica's wall clock (clock-skew fault)
#   iproute2  `ip netns` and veth links (network-partition fault)
# Installs only what is missing; prints nothing when all is there.
set -euo pipefail
need=()
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ]] || need+=(faketime)
command -v ip >/dev/null || need+=(iproute2)
((${#need[@]} == 0)) && exit 0
echo "host-tools.sh: installing ${need[*]} from Debian's packages" >&2
if [[ $(id -u) -ne 0 ]]; then
	echo "host-tools.sh: not root; install ${need[*]} yourself" >&2
	exit 1
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null ||
	{ apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
