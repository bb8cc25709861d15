# fencekeeper — `make help` lists the targets and the variables you can set;
# docs/development.md explains them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

ROOT := $(abspath .)
BIN := $(ROOT)/bin
GO ?= go
# One set of build flags for `make build` and the image (make image, Dockerfile).
GO_BUILD_FLAGS ?= -trimpath -ldflags=-s -ldflags=-w
IMG_DEFAULT := ghcr.io/fencekeeper/fencekeeper:dev
IMG ?= $(IMG_DEFAULT)
CONTAINER_TOOL ?= docker
# make image: the manager image built by hack/image (its own Go module) with
# no container engine. IMAGE_ARCH: its linux architecture (default: this
# machine's). The commit and its time go into the labels and timestamps, so
# the same commit gives the same digest.
IMAGE_MODULE := hack/image
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_BINARY = $(BIN)/linux-$(IMAGE_ARCH)/manager
IMAGE_TAR := $(BIN)/image.tar
IMAGE_OCI := $(BIN)/image-oci
IMAGE_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
TEST_TIMEOUT ?= 30m
# make test runs the chaos suite for this long; make chaos sets its own.
CHAOS_BUDGET ?=
CHAOS_RUNS ?=
CHAOS_SEED ?=
CHAOS_PARALLEL ?= 2
CHAOS_PARTITIONS ?=
CHAOS_FENCING_MODE ?=
CHAOS_LEADER_ELECTION ?=

CONTROLLER_GEN := $(BIN)/controller-gen

# Files `make manifests generate` writes; verify-gen fails when git sees them changed.
GENERATED := api config charts docs/manager-flags.md

# envtest finds etcd, kube-apiserver and kubectl here; nothing is downloaded.
export KUBEBUILDER_ASSETS := $(BIN)

.PHONY: all
all: build

##@ Tools (built from the Go module proxy into bin/, only when missing or re-pinned)

.PHONY: tools
tools: ## Build kube-apiserver, kube-controller-manager, kube-scheduler, etcd, etcdutl, kubectl, kwok, controller-gen, helm and promtool into bin/.
	@hack/build-tool.sh controller-gen
	@hack/build-tool.sh etcd
	@hack/build-tool.sh etcdutl
	@hack/build-tool.sh kube-apiserver
	@hack/build-tool.sh kube-controller-manager
	@hack/build-tool.sh kube-scheduler
	@hack/build-tool.sh kubectl
	@hack/build-tool.sh kwok
	@hack/build-tool.sh helm
	@hack/build-tool.sh promtool

.PHONY: controller-gen
controller-gen:
	@hack/build-tool.sh controller-gen

##@ Code generation

.PHONY: manifests
manifests: controller-gen ## Generate the CRD, RBAC, webhook configuration, chart files and docs/manager-flags.md.
	$(CONTROLLER_GEN) rbac:roleName=fencekeeper-manager crd paths="./api/..." paths="./controllers/..." paths="./internal/manager/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	$(GO) run ./hack/gen-webhook --out config/webhook/manifests.yaml
	hack/sync-chart.sh
	$(GO) run ./hack/gen-chart-readme charts/fencekeeper
	$(GO) run ./hack/gen-flags --go $(GO) --out docs/manager-flags.md

.PHONY: generate
generate: controller-gen ## Generate deepcopy functions.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."

.PHONY: verify-gen
verify-gen: manifests generate ## Fail when a generated file is stale.
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		echo "generated files are stale; run 'make manifests generate' and commit:"; \
		git status --porcelain -- $(GENERATED); git --no-pager diff --stat -- $(GENERATED); exit 1; fi

##@ Build

.PHONY: build
build: ## Build bin/manager and bin/kubectl-fence.
	CGO_ENABLED=0 $(GO) build $(GO_BUILD_FLAGS) -o $(BIN)/manager ./cmd/manager
	CGO_ENABLED=0 $(GO) build $(GO_BUILD_FLAGS) -o $(BIN)/kubectl-fence ./cmd/kubectl-fence

.PHONY: image
image: ## Build the manager image IMG with no container engine (like ko): bin/image.tar (docker load, kind load image-archive) and bin/image-oci/.
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build $(GO_BUILD_FLAGS) -o $(IMAGE_BINARY) ./cmd/manager
	$(GO) -C $(IMAGE_MODULE) run . build --binary $(IMAGE_BINARY) --arch $(IMAGE_ARCH) --ref '$(IMG)' \
		--revision '$(IMAGE_REVISION)' --created '$(SOURCE_DATE_EPOCH)' --tarball $(IMAGE_TAR) --oci-layout $(IMAGE_OCI)

.PHONY: image-push
image-push: ## Build the image and push it to IMG=REGISTRY/REPOSITORY:TAG (required) with your docker login credentials.
	@if [ "$(origin IMG)" = file ] || [ -z "$(IMG)" ]; then \
		echo "make image-push needs IMG=REGISTRY/REPOSITORY:TAG, a repository you may push to" \
			"(the default, $(IMG_DEFAULT), names the image make image builds for local use; see docs/install.md#the-image)" >&2; \
		exit 2; fi
	@$(MAKE) --no-print-directory image IMG='$(IMG)'
	$(GO) -C $(IMAGE_MODULE) run . push --oci-layout $(IMAGE_OCI) --ref '$(IMG)'

.PHONY: docker-build
docker-build: ## Build the manager image IMG with CONTAINER_TOOL (default docker; needs a container engine, none runs on the CI machines).
	$(CONTAINER_TOOL) build --build-arg GO_BUILD_FLAGS="$(GO_BUILD_FLAGS)" -t $(IMG) .

.PHONY: vet
vet: ## Run go vet on every package (and hack/image's module).
	$(GO) vet ./...
	$(GO) -C $(IMAGE_MODULE) vet ./...

.PHONY: fmt-check
fmt-check: ## Fail when a Go file is not gofmt-formatted.
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi

.PHONY: lint
lint: ## Run golangci-lint with .golangci.yml.
	@hack/build-tool.sh golangci-lint
	$(BIN)/golangci-lint run ./...
	cd $(IMAGE_MODULE) && $(BIN)/golangci-lint run ./...

##@ Test

.PHONY: test
test: tools verify-gen fmt-check vet ## Every test, against a real kube-apiserver and etcd built into bin/ (what CI runs).
	$(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./...
	$(GO) -C $(IMAGE_MODULE) test -timeout $(TEST_TIMEOUT) -count=1 ./...

.PHONY: test-unit
test-unit: ## Pure tests only (every package outside test/ and hack/demo*, and hack/image): no control plane, no bin/ binaries, seconds once compiled.
	$(GO) test -timeout $(TEST_TIMEOUT) -count=1 $$($(GO) list ./... | grep -v -e /test/ -e /hack/demo)
	$(GO) -C $(IMAGE_MODULE) test -timeout $(TEST_TIMEOUT) -count=1 ./...

##@ Local control plane, demo and benchmark

.PHONY: run
run: tools build manifests ## Local control plane + CRD + manager in the foreground; Ctrl-C stops all.
	$(GO) build -o $(BIN)/devcluster ./hack/devcluster
	exec $(BIN)/devcluster --dir .dev --manager $(BIN)/manager

.PHONY: dev-up
dev-up: tools build manifests ## The same in the background; kubeconfig at .dev/kubeconfig.
	@hack/dev-up.sh

.PHONY: helm-local
helm-local: tools build manifests ## The Helm chart installed by bin/helm into a bare dev-up control plane, which runs its pods as bin/manager processes (docs/install.md).
	@hack/helm-local.sh

.PHONY: chaos
chaos: tools ## Randomized fault runs (CHAOS_RUNS=500, or CHAOS_BUDGET=10m; CHAOS_SEED=n replays one run); report in .chaos/.
	CHAOS_RUNS="$(CHAOS_RUNS)" CHAOS_BUDGET="$(CHAOS_BUDGET)" CHAOS_SEED="$(CHAOS_SEED)" CHAOS_PARALLEL="$(CHAOS_PARALLEL)" CHAOS_PARTITIONS="$(CHAOS_PARTITIONS)" CHAOS_FENCING_MODE="$(CHAOS_FENCING_MODE)" CHAOS_LEADER_ELECTION="$(CHAOS_LEADER_ELECTION)" \
		$(GO) test -count=1 -timeout 0 -run '^TestChaos$$' -v ./test/chaos

.PHONY: chaos-mutants
chaos-mutants: tools ## Apply each seeded bug in test/chaos/mutants/ to a copy and check that the suite catches it.
	hack/chaos-mutants.sh $(MUTANT)

.PHONY: bench
bench: tools build ## Benchmark report (BENCH_QUICK=1 for a short run); writes .bench/report.json.
	$(GO) run ./test/bench

.PHONY: demo
demo: ## Replay the report handoff with real processes: W1 paused, W2 takes over, W1's late write refused.
	@hack/demo.sh demo

.PHONY: demo-leader
demo-leader: ## Two replicas of a sample operator under fenced leader election: the paused old leader's allocation is refused.
	@hack/demo.sh demo-leader

.PHONY: dev-down
dev-down: ## Stop what dev-up started.
	@hack/dev-down.sh

.PHONY: clean
clean: ## Remove .dev/ (the local control plane's state; run make dev-down first).
	rm -rf .dev

##@ Help

.PHONY: help
help: ## Show the targets by section, then the variables you can set.
	@echo "Usage: make <target> [VARIABLE=value ...]"
	@awk 'BEGIN {FS = ":.*## "} \
		/^##@/ {printf "\n%s\n", substr($$0, 5)} \
		/^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "Variables (on the make command line or in the environment):"
	@echo "  TEST_TIMEOUT             go test -timeout per package (now: $(TEST_TIMEOUT))"
	@echo "  BENCH_QUICK=1            make bench: smaller samples, about 2 minutes"
	@echo "  BENCH_GOMEMLIMIT         make bench: GOMEMLIMIT of the manager under test (default 128MiB, the chart's)"
	@echo "  BENCH_ONLY=takeover,...  make bench: run only these steps (and the floor); judges no goal. Steps: grant handoff etcd-mutex resync takeover graceful throughput admission cel staleness scale"
	@echo "  BENCH_SCALE_CURVE=1      make bench: also the scale curve to 50,000 claims (rss_mib_50k, scale_curve; 15 minutes or more)"
	@echo "  APISERVER_PORT           run, dev-up: kube-apiserver port on 127.0.0.1 (default 16443)"
	@echo "  MANAGER_METRICS_ADDRESS  run, dev-up: manager metrics address (default 127.0.0.1:18080)"
	@echo "  MANAGER_PROBE_ADDRESS    run, dev-up: manager health probe address (default 127.0.0.1:18081)"
	@echo "  GUARDED_RESOURCES        run, dev-up: kinds the fencing webhook guards, RESOURCE[.GROUP],... (default configmaps)"
	@echo "  FENCING_MODE             run, dev-up: webhook (default) or cel (the fencing rules as admission policies inside the apiserver)"
	@echo "  BARE=1                   run, dev-up: control plane only, no CRD/webhook/policy/manager (to try the Helm chart)"
	@echo "  CLUSTER=full             run, dev-up: also kube-controller-manager, kube-scheduler and kwok (two fake nodes): real Deployments, scheduling, GC, namespace deletion"
	@echo "  DEV_DIR                  dev-up, dev-down: state directory: kubeconfig, logs, ready marker (default .dev)"
	@echo "  MANAGER_BIN              dev-up: the manager binary to run (default bin/manager)"
	@echo "  CHAOS_RUNS, CHAOS_BUDGET chaos: how many runs, or for how long (make test: 60s); CHAOS_SEED=n replays one run"
	@echo "  CHAOS_PARALLEL           chaos: runs at once (default 2); CHAOS_PARTITIONS=1 adds partitions of the manager process; CHAOS_FENCING_MODE=cel runs it in CEL enforcement mode; CHAOS_LEADER_ELECTION=1 runs both managers under leader election"
	@echo "  IMG                      image, image-push, docker-build: image name REGISTRY/REPOSITORY:TAG (now: $(IMG); image-push needs one set)"
	@echo "  IMAGE_ARCH               image, image-push: the image's linux architecture, a GOARCH (now: $(IMAGE_ARCH))"
	@echo "  SOURCE_DATE_EPOCH        image: creation time of the image and its files (default: the commit's time, for a reproducible digest)"
	@echo "  CONTAINER_TOOL           docker-build: container engine (now: $(CONTAINER_TOOL))"
	@echo "  KUBEBUILDER_ASSETS       where envtest finds etcd, kube-apiserver, kubectl; make sets it to bin/ (set it yourself for a bare go test)"
	@echo "  GO                       the go command (now: $(GO))"
