#!/usr/bin/env bash
# Assembles the kind node image from project-owned parts, offline (kind's own `build node-image`
# always pulls coredns, kindnetd, pause, etcd and local-path images):
#   1. a Debian 12 root filesystem from debootstrap (node/packages), cached as a tar;
#   2. the node's files (node/files: entrypoint, kubelet units, containerd config, manifests), the
#      kubelet, kubeadm and kubectl of e2e/cluster/build.sh, /kind/version;
#   3. the images kubeadm starts, preloaded into the node's containerd: kube-apiserver,
#      kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS and the pause program of
#      progs/, each a minimal image holding the binary built here; and progs/workload, the pods
#      the e2e suite drains.
# The tag carries a hash of every input, so the image is rebuilt only when one of them changes.
# Needs the engine (engine.sh start) and the binaries (build.sh kubernetes etcd kind coredns).
#
# Usage: e2e/kind/node-image.sh      prints the image's tag as its last line
set -euo pipefail
PROG=e2e/kind/node-image.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

eval "$("$REPO/e2e/cluster/build.sh" --print-env)"
[[ -n ${GPUNODE_COREDNS:-} ]] || die "CoreDNS is not built (e2e/cluster/build.sh coredns)"
K8S_BIN=$(dirname "$GPUNODE_KUBE_APISERVER")
ETCD_TAG=${GPUNODE_ETCD_VERSION#v}-0
PROGS=$CACHE/kind/progs
[[ -x $PROGS/pause ]] || die "the programs of e2e/kind/progs are not built (engine.sh start builds them)"
docker info >/dev/null 2>&1 || die "the engine is not running (e2e/kind/engine.sh start)"
mkdir -p "$CACHE/kind" "$CACHE/logs"

# --- 1. root filesystem ------------------------------------------------------------------------
SUITE=bookworm
PKGS=$(grep -v '^#' "$KIND_HERE/node/packages" | paste -sd, -)
ROOTFS_KEY=$(printf '%s %s' "$SUITE" "$PKGS" | sha256sum | cut -c1-12)
ROOTFS_TAR=$CACHE/kind/rootfs-$SUITE-$ROOTFS_KEY.tar
ROOTFS_IMAGE=gpunode.local/kind-rootfs:$ROOTFS_KEY
if [[ ! -f $ROOTFS_TAR ]]; then
	command -v debootstrap >/dev/null || die "debootstrap is missing (engine.sh start installs it)"
	dir=$CACHE/kind/rootfs.tmp
	rm -rf "$dir"
	log "node image: debootstrap $SUITE (about a minute; log $CACHE/logs/debootstrap.log)"
	debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$dir" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
		>"$CACHE/logs/debootstrap.log" 2>&1 || { tail -n 20 "$CACHE/logs/debootstrap.log" >&2; die "debootstrap failed"; }
	# Packages downloaded to build it are not part of the node.
	rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
	tar -C "$dir" --numeric-owner -cf "$ROOTFS_TAR.tmp" .
	mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
	rm -rf "$dir"
fi
if ! docker image inspect "$ROOTFS_IMAGE" >/dev/null 2>&1; then
	docker import "$ROOTFS_TAR" "$ROOTFS_IMAGE" >/dev/null
fi

# --- the node image's tag: every input -----------------------------------------------------------
stamps=$(cat "$K8S_BIN/.stamp" "$(dirname "$GPUNODE_ETCD")/.stamp" "$(dirname "$GPUNODE_COREDNS")/.stamp")
NODE_KEY=$( {
	printf '%s\n' "$ROOTFS_KEY" "$stamps" "$(readlink -f "$PROGS")"
	hash_of "$KIND_HERE/node" "$KIND_HERE/progs" "$0"
} | sha256sum | cut -c1-12)
NODE_IMAGE=gpunode.local/kind-node:$GPUNODE_K8S_VERSION-$NODE_KEY
if docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
	log "node image: $NODE_IMAGE (cached)"
	printf '%s\n' "$NODE_IMAGE"
	exit 0
fi
log "node image: assembling $NODE_IMAGE"
t0=$SECONDS
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"; docker rm -f gpunode-node-preload >/dev/null 2>&1 || true' EXIT

# --- 3a. the component images ----------------------------------------------------------------------
# IMAGE BINARY [ENTRYPOINT]: an image of one static binary in /usr/local/bin (the commands kubeadm
# writes into its static pods are looked up on the PATH).
one_binary_image() {
	local image=$1 bin=$2 entry=${3:-} d
	d=$ctx/img
	rm -rf "$d"
	mkdir -p "$d/usr/local/bin" "$d/tmp" "$d/etc"
	cp "$bin" "$d/usr/local/bin/"
	printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$d/etc/passwd"
	chmod 1777 "$d/tmp"
	local changes=(--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin')
	[[ -z $entry ]] || changes+=(--change "ENTRYPOINT [\"$entry\"]")
	tar -C "$d" --numeric-owner --owner=0 --group=0 -c . | docker import "${changes[@]}" - "$image" >/dev/null
}
IMAGES=()
for b in kube-apiserver kube-controller-manager kube-scheduler; do
	one_binary_image "registry.k8s.io/$b:$GPUNODE_K8S_VERSION" "$K8S_BIN/$b"
	IMAGES+=("registry.k8s.io/$b:$GPUNODE_K8S_VERSION")
done
one_binary_image "registry.k8s.io/etcd:$ETCD_TAG" "$GPUNODE_ETCD"
IMAGES+=("registry.k8s.io/etcd:$ETCD_TAG")
one_binary_image "registry.k8s.io/coredns/coredns:$GPUNODE_COREDNS_VERSION" "$GPUNODE_COREDNS" /usr/local/bin/coredns
IMAGES+=("registry.k8s.io/coredns/coredns:$GPUNODE_COREDNS_VERSION")
one_binary_image gpunode.local/pause:1 "$PROGS/pause" /usr/local/bin/pause
IMAGES+=(gpunode.local/pause:1)
# The test workload of the drain scenarios (progs/workload).
one_binary_image gpunode.local/workload:1 "$PROGS/workload" /usr/local/bin/workload
IMAGES+=(gpunode.local/workload:1)
# kube-proxy programs iptables: the node's own root filesystem has them.
mkdir -p "$ctx/proxy"
cp "$K8S_BIN/kube-proxy" "$ctx/proxy/"
printf 'FROM %s\nCOPY kube-proxy /usr/local/bin/kube-proxy\n' "$ROOTFS_IMAGE" >"$ctx/proxy/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t "registry.k8s.io/kube-proxy:$GPUNODE_K8S_VERSION" "$ctx/proxy" >/dev/null
IMAGES+=("registry.k8s.io/kube-proxy:$GPUNODE_K8S_VERSION")

# --- 2. the node's files and binaries ----------------------------------------------------------------
mkdir -p "$ctx/node/bin"
cp -a "$KIND_HERE/node/files" "$ctx/node/files"
cp "$K8S_BIN/kubelet" "$K8S_BIN/kubeadm" "$K8S_BIN/kubectl" "$ctx/node/bin/"
cat >"$ctx/node/Dockerfile" <<DOCKERFILE
FROM $ROOTFS_IMAGE
COPY files/ /
COPY bin/ /usr/bin/
RUN echo "$GPUNODE_K8S_VERSION" >/kind/version \\
 && : >/etc/machine-id \\
 && mkdir -p /etc/kubernetes/manifests /etc/cni/net.d /var/lib/kubelet \\
 && systemctl enable containerd.service kubelet.service \\
 && systemctl set-default multi-user.target \\
 && systemctl mask getty.target console-getty.service systemd-udevd.service systemd-modules-load.service \\
      systemd-logind.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer 2>/dev/null || true
ENTRYPOINT ["/usr/local/bin/entrypoint"]
CMD ["/sbin/init"]
STOPSIGNAL SIGRTMIN+3
DOCKERFILE
DOCKER_BUILDKIT=0 docker build -q -t "$NODE_IMAGE-raw" "$ctx/node" >/dev/null

# --- 3b. preload: the images into the node's containerd (namespace k8s.io, as the kubelet uses) --------
docker rm -f gpunode-node-preload >/dev/null 2>&1 || true
# --init: a process that reaps containerd once it is stopped.
docker run -d --init --name gpunode-node-preload --privileged --network none --entrypoint /bin/sleep "$NODE_IMAGE-raw" infinity >/dev/null
docker exec gpunode-node-preload sh -c 'containerd >/var/log/preload-containerd.log 2>&1 &'
# ctr's dial waits for the socket to answer, at most --connect-timeout.
docker exec gpunode-node-preload ctr --connect-timeout 60s version >/dev/null ||
	die "containerd did not start in the preload container"
docker save "${IMAGES[@]}" | docker exec -i gpunode-node-preload ctr -n k8s.io images import --all-platforms --no-unpack - >/dev/null
listed=$(docker exec gpunode-node-preload ctr -n k8s.io images ls -q)
for i in "${IMAGES[@]}"; do
	grep -qF "$i" <<<"$listed" || die "$i is not in the node's containerd after the import"
done
# Stop containerd and block until it has exited (reaped by the container's init), at most 30 s.
docker exec gpunode-node-preload sh -c 'pid=$(pgrep -x containerd) && kill "$pid" && timeout 30 tail --pid="$pid" -f /dev/null; rm -f /var/log/preload-containerd.log' ||
	die "containerd did not stop in the preload container"
# The container keeps the raw image's STOPSIGNAL (SIGRTMIN+3: systemd's halt); the entrypoint and
# command were replaced by `docker run` above.
docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint"]' --change 'CMD ["/sbin/init"]' \
	gpunode-node-preload "$NODE_IMAGE" >/dev/null
[[ $(docker image inspect "$NODE_IMAGE" --format '{{.Config.StopSignal}}') == SIGRTMIN+3 ]] ||
	die "the node image lost its stop signal"
docker rm -f gpunode-node-preload >/dev/null
docker rmi "$NODE_IMAGE-raw" "${IMAGES[@]}" >/dev/null
# Older node images are of no use any more.
for old in $(docker images gpunode.local/kind-node --format '{{.Repository}}:{{.Tag}}'); do
	[[ $old == "$NODE_IMAGE" ]] || docker rmi "$old" >/dev/null 2>&1 || true
done
log "node image: $NODE_IMAGE in $((SECONDS - t0))s ($(docker image inspect "$NODE_IMAGE" --format '{{.Size}}' | awk '{printf "%d MB", $1 / 1e6}'))"
printf '%s\n' "$NODE_IMAGE"
