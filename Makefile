# gpunode — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo

.PHONY: images kind-up kind-down kind-test fuzz reliability-long reliability-report help demo test lint unit crds cluster-build cluster-up cluster-down bench bench-sim bench-probe bench-probe-latency demo-down

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

demo: ## build everything, start a local control plane with fake GPU nodes and watch gpunode act
	e2e/demo/demo.sh

demo-down: ## stop the demo
	e2e/demo/down.sh

# The e2e tests start (or reuse) the local control plane .cluster/test; it is stopped afterwards
# whatever the outcome. GPUNODE_KUBECONFIG=path runs them against an existing cluster instead.
# The operator's micro-benchmarks run small under `cargo test --benches`, so their assertions
# (the fleet they build already carries what the plan wants) cannot go stale unseen.
test: lint cluster-build ## every test: fmt, clippy, unit, property, CRD freshness, e2e on a local control plane, then on kind (real pods)
	$(CARGO) build --workspace --locked
	@rm -rf "$(REL_RESULTS)"
	@status=0; GPUNODE_CLUSTER_NAME=test $(CARGO) test --workspace --locked || status=$$?; \
	  GPUNODE_CLUSTER_NAME=test GPUNODE_PLANNING=incremental $(CARGO) test -p gpunode-e2e --locked $(INCREMENTAL_E2E) || status=1; \
	  $(CARGO) test -p gpunode-operator --benches --locked || status=1; \
	  if [ -z "$$GPUNODE_KUBECONFIG" ]; then GPUNODE_CLUSTER_NAME=test e2e/cluster/down.sh || true; fi; \
	  GPUNODE_CLUSTER_NAME=rel-test e2e/cluster/down.sh || true; \
	  $(CARGO) run --quiet --locked -p gpunode-e2e --bin reliability-report -- "$(REL_RESULTS)" || status=1; \
	  CARGO="$(CARGO)" e2e/kind/test.sh || status=1; \
	  exit $$status

# e2e tests that run a second time with incremental planning (`--planning incremental`, not
# yet the default): the operator's core, a drain, a quarantine, validation, repair, a person's
# cordon, approval.
INCREMENTAL_E2E = --test operator --test drain --test quarantine --test validation --test repair --test human --test approval

# Results of the reliability suite (docs/reliability.md): JSON per test binary, aggregated by
# e2e/src/bin/reliability-report.rs.
REL_RESULTS = $(or $(CARGO_TARGET_DIR),target)/tmp/reliability

reliability-long: ## the reliability suite at scale (1,000+ fault runs, about 2 h 45 min on 2 cores, 20 crashes at each crash point, 10,000 bad inputs, longer outages (the API server's 10 minutes), a 3 s API latency, the storms with a 10-minute breaker window, 20x the fuzz cases); rewrites docs/reliability.md
	$(CARGO) build --workspace --locked
	@rm -rf "$(REL_RESULTS)"
	@status=0; GPUNODE_CLUSTER_NAME=rel GPUNODE_REL_SEEDS=90 GPUNODE_REL_WAVES_PER_PHASE=2 GPUNODE_REL_PARTITIONS=20 \
	  GPUNODE_REL_OUTAGE_SECS=60 GPUNODE_REL_API_OUTAGE_SECS=600 GPUNODE_REL_STORM_RESTARTS=10 GPUNODE_REL_LATENCIES_MS=250,1000,3000 GPUNODE_REL_FLOOD=2000 GPUNODE_REL_ACTOR_SECS=60 GPUNODE_REL_BAD_INPUTS=10000 GPUNODE_REL_CRASH_RUNS=20 \
	  GPUNODE_REL_UPGRADE=1 GPUNODE_STORM_WINDOW_S=600 PROPTEST_CASES=5000 $(CARGO) test --workspace --locked --no-fail-fast \
	  --test 'reliability_*' --test 'fuzz_*' --test storms -- --test-threads=1 || status=$$?; \
	  GPUNODE_CLUSTER_NAME=rel-rel e2e/cluster/down.sh || true; \
	  GPUNODE_RELIABILITY_DIR="$(REL_RESULTS)" fuzz/run.sh 120 || status=1; \
	  $(CARGO) run --quiet --locked -p gpunode-e2e --bin reliability-report -- --long "$(REL_RESULTS)" docs/reliability.md || status=1; \
	  exit $$status

# Coverage-guided fuzzing (cargo-fuzz / libFuzzer, nightly; cargo-fuzz is installed into
# ~/.cache/gpunode by fuzz/install.sh). Not part of `make test`; reliability-long runs it too.
fuzz: ## libFuzzer on the DCB parser, version ranges, durations and report decoding (FUZZ_SECS=60 each)
	GPUNODE_RELIABILITY_DIR="$(REL_RESULTS)" fuzz/run.sh $(or $(FUZZ_SECS),60)

reliability-report: ## print the last reliability results and write them into docs/reliability.md
	$(CARGO) run --quiet --locked -p gpunode-e2e --bin reliability-report -- "$(REL_RESULTS)" docs/reliability.md

# cargo-deny and cargo-cyclonedx are installed, pinned, into ~/.cache/gpunode/tools by
# supply-chain/tool.sh on first use (a cold machine builds them once).
lint: ## cargo fmt --check, clippy with warnings denied, cargo deny (licenses, bans, sources; deny.toml), the SBOM generator
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy -p gpunode-e2e --all-targets --features kind --locked -- -D warnings
	CARGO="$(CARGO)" supply-chain/deny.sh
	CARGO="$(CARGO)" supply-chain/sbom-test.sh
	@# fuzz/ is its own workspace with its own lock, which a workspace dependency change leaves
	@# stale (cargo fuzz then rewrites it and every result after names a dirty tree).
	$(CARGO) metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null

crds: ## regenerate charts/gpunode/crds from the Rust types
	$(CARGO) run --quiet --locked -p gpunode-operator -- crds --write charts/gpunode/crds >/dev/null

cluster-build: ## build (or reuse from cache) etcd, kube-apiserver, KCM, scheduler, kwok, helm, promtool (alert tests), toxiproxy (API latency fault); host tools of the fault suite
	e2e/cluster/build.sh
	e2e/cluster/host-tools.sh

cluster-up: ## start a local control plane; prints the kubeconfig path last
	@e2e/cluster/up.sh

cluster-down: ## stop the local control plane started by cluster-up
	@e2e/cluster/down.sh

# Published-style images: release binaries on distroless cc-debian12 (pulled), with the Docker
# engine of this machine. Offline, BASE is assembled here: see e2e/kind/images.sh.
# Each image's SBOM (CycloneDX JSON, supply-chain/sbom.sh) lands in $(SBOM_DIR):
# operator.cdx.json and node-probe.cdx.json.
IMAGE_BASE ?= gcr.io/distroless/cc-debian12:nonroot
SBOM_DIR = $(or $(CARGO_TARGET_DIR),target)/images
images: ## the operator and node-probe images from release binaries (IMAGE_BASE, REPOSITORY, TAG; needs Docker), and their SBOMs in target/images/
	$(CARGO) build --release --locked -p gpunode-operator -p gpunode-probe
	GPUNODE_DOCKER_HOST="$${DOCKER_HOST:-unix:///var/run/docker.sock}" BASE="$(IMAGE_BASE)" \
	  REPOSITORY="$(or $(REPOSITORY),gpunode)" TAG="$(or $(TAG),$$($(CARGO) pkgid -p gpunode-operator | sed 's/.*[#@]//'))" \
	  e2e/kind/images.sh target/release
	CARGO="$(CARGO)" supply-chain/sbom.sh "$(SBOM_DIR)" operator node-probe

# The kind cluster (e2e/kind): real kubelets, the chart's images and DaemonSet, built offline with
# the project's own Docker engine and node image. GPUNODE_KIND_CLUSTER names it (default gpunode-kind).
kind-up: ## a kind cluster with real kubelets and the chart installed from images built here; prints the kubeconfig
	$(CARGO) build --workspace --locked
	@e2e/kind/cluster.sh up

kind-down: ## delete the kind cluster and stop its Docker engine (no container, network or daemon left)
	@e2e/kind/cluster.sh down

kind-test: ## the kind e2e suite on real pods (creates the cluster if needed, deletes it afterwards)
	$(CARGO) build --workspace --locked
	e2e/kind/test.sh

bench-probe: ## node-probe steady-state CPU, RSS and writes/hour at default intervals (SECONDS=600)
	node-probe/benches/soak.sh $(or $(SECONDS),600)

bench-probe-latency: ## node-probe observation -> stored report per check class (ROUNDS=3)
	node-probe/benches/latency.sh $(or $(ROUNDS),3)

# The N of `make bench-sim` (a comma inside $(or ...) would split its arguments) and its runs per N.
SIM_NS ?= 10000,50000,100000
SIM_REPS ?= 3

bench-sim: ## the operator alone against a synthetic API at SIM_NS (10000,50000,100000) nodes, SIM_REPS (3) runs each; results in docs/benchmarks/sim
	$(CARGO) build --release --locked -p gpunode-operator -p gpunode-bench
	@mkdir -p docs/benchmarks/sim
	$(or $(CARGO_TARGET_DIR),target)/release/gpunode-bench sim --nodes $(SIM_NS) \
	  --reps $(SIM_REPS) --operator $(or $(CARGO_TARGET_DIR),target)/release/gpunode-operator --out docs/benchmarks/sim

bench: ## scale benchmark (not part of test): N = BENCH_NS (100,1000,5000) KWOK nodes, results in docs/benchmarks
	bench/run.sh
