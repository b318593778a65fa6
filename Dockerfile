# The operator and node-probe images. They package binaries built beforehand (`make images` builds
# them with cargo and stages them as bin/ of the build context), on a base with glibc, libgcc and a
# CA bundle:
#   published images: the default base, distroless cc-debian12 (pulled from gcr.io);
#   offline machines: BASE=gpunode.local/runtime-base:<hash>, assembled from this machine's own
#   libraries by e2e/kind/images.sh (no registry is needed).
# Both run as uid 65532 (nonroot) and are meant for a read-only root filesystem (the chart sets
# it): nothing is written inside the image.
#   docker build --target operator   -t gpunode/operator:TAG   CONTEXT
#   docker build --target node-probe -t gpunode/node-probe:TAG CONTEXT
ARG BASE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BASE} AS operator
COPY bin/gpunode-operator /usr/local/bin/gpunode-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpunode-operator"]
CMD ["run"]

# Non-root like the operator: NVML (device nodes from the NVIDIA runtime), sysfs and the DCB and
# ethtool reads need no privileges. The chart runs it as 65532 with every capability dropped.
FROM ${BASE} AS node-probe
COPY bin/gpunode-probe /usr/local/bin/gpunode-probe
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpunode-probe"]
