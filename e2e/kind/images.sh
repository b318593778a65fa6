#!/usr/bin/env bash
# Builds the operator and node-probe images from binaries built on this machine, with the
# repository's Dockerfile. Prints "OPERATOR_IMAGE PROBE_IMAGE" (tags carry the binaries' hash).
#
# Usage:  e2e/kind/images.sh BINARY_DIR        (e.g. target/debug or target/release)
# Environment:
#   BASE        the base image (default: gpunode.local/runtime-base, assembled here from this
#               machine's glibc, libgcc and CA bundle: the offline counterpart of distroless
#               cc-debian12, which `make images` uses for published images)
#   REPOSITORY  image name prefix (default gpunode)
#   TAG         the images' tag (default kind-<hash of the binaries, the Dockerfile and the base>)
set -euo pipefail
PROG=e2e/kind/images.sh
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bindir=${1:?usage: images.sh BINARY_DIR}
repo_prefix=${REPOSITORY:-gpunode}
docker info >/dev/null 2>&1 || die "no Docker engine answers at $DOCKER_HOST (e2e/kind/engine.sh start)"
for b in gpunode-operator gpunode-probe; do
	[[ -x $bindir/$b ]] || die "$bindir/$b is missing: cargo build first"
done

# The offline base: exactly the shared libraries the binaries link (ldd), the nonroot user, a CA
# bundle and a /tmp — what distroless cc-debian12 provides.
runtime_base() {
	local d libs f key tag
	d=$(mktemp -d)
	libs=$(ldd "$bindir/gpunode-operator" "$bindir/gpunode-probe" "$bindir/libfake_nvml.so" 2>/dev/null |
		awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/lib/ {print $1}' | sort -u)
	for f in $libs; do
		mkdir -p "$d$(dirname "$f")"
		cp -L "$f" "$d$f"
	done
	mkdir -p "$d/etc/ssl/certs" "$d/tmp" "$d/home/nonroot"
	chmod 1777 "$d/tmp"
	chown 65532:65532 "$d/home/nonroot"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$d/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/etc/group"
	cp -L /etc/ssl/certs/ca-certificates.crt "$d/etc/ssl/certs/"
	key=$(cd "$d" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
	tag=gpunode.local/runtime-base:$key
	if ! docker image inspect "$tag" >/dev/null 2>&1; then
		tar -C "$d" --numeric-owner -c . | docker import - "$tag" >/dev/null
	fi
	rm -rf "$d"
	printf '%s' "$tag"
}

base=${BASE:-$(runtime_base)}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin"
for b in gpunode-operator gpunode-probe; do
	# Debug symbols are most of a debug build's size; the image needs none of them.
	objcopy --strip-debug "$bindir/$b" "$ctx/bin/$b" 2>/dev/null || cp "$bindir/$b" "$ctx/bin/$b"
done
key=$( (cat "$ctx/bin/"* "$REPO/Dockerfile" | sha256sum; printf '%s\n' "$base") | sha256sum | cut -c1-12)
out=()
for target in operator node-probe; do
	image=$repo_prefix/$target:${TAG:-kind-$key}
	if [[ -n ${TAG:-} ]] || ! docker image inspect "$image" >/dev/null 2>&1; then
		# The legacy builder uses a local base as it is (BuildKit would try to resolve it remotely).
		DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$base" --target "$target" -t "$image" \
			-f "$REPO/Dockerfile" "$ctx" >/dev/null || die "docker build of $image failed"
	fi
	out+=("$image")
done
printf '%s %s\n' "${out[@]}"
