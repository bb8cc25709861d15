# fencekeeper — see README.md for what each target does.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

ROOT := $(abspath .)
BIN := $(ROOT)/bin
GO ?= go
# One set of build flags for `make build` and the image (Dockerfile).
GO_BUILD_FLAGS ?= -trimpath -ldflags=-s -ldflags=-w
IMG ?= ghcr.io/fencekeeper/fencekeeper:dev
CONTAINER_TOOL ?= docker
GINKGO_FLAGS ?=
TEST_TIMEOUT ?= 30m

CONTROLLER_GEN := $(BIN)/controller-gen

# envtest finds etcd, kube-apiserver and kubectl here; nothing is downloaded.
export KUBEBUILDER_ASSETS := $(BIN)

.PHONY: all
all: build

##@ Tools (built from the Go module proxy into bin/, only when missing or re-pinned)

.PHONY: tools
tools: ## Build kube-apiserver, etcd, kubectl, controller-gen and helm into bin/.
	@hack/build-tool.sh controller-gen
	@hack/build-tool.sh etcd
	@hack/build-tool.sh kube-apiserver
	@hack/build-tool.sh kubectl
	@hack/build-tool.sh helm

.PHONY: controller-gen
controller-gen:
	@hack/build-tool.sh controller-gen

##@ Code generation

.PHONY: manifests
manifests: controller-gen ## Generate the CRD, RBAC and webhook configuration into config/.
	$(CONTROLLER_GEN) rbac:roleName=fencekeeper-manager crd paths="./api/..." paths="./controllers/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	$(GO) run ./hack/gen-webhook --out config/webhook/manifests.yaml
	hack/sync-chart.sh
	$(GO) run ./hack/gen-chart-readme charts/fencekeeper

.PHONY: generate
generate: controller-gen ## Generate deepcopy functions.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."

.PHONY: verify-gen
verify-gen: manifests generate ## Fail when a generated file is stale.
	@if [ -n "$$(git status --porcelain -- api config charts)" ]; then \
		echo "generated files are stale; run 'make manifests generate' and commit:"; \
		git status --porcelain -- api config charts; git --no-pager diff --stat -- api config charts; exit 1; fi

##@ Build

.PHONY: build
build: ## Build bin/manager and bin/kubectl-fence.
	CGO_ENABLED=0 $(GO) build $(GO_BUILD_FLAGS) -o $(BIN)/manager ./cmd/manager
	CGO_ENABLED=0 $(GO) build $(GO_BUILD_FLAGS) -o $(BIN)/kubectl-fence ./cmd/kubectl-fence

.PHONY: docker-build
docker-build: ## Build the manager image with $(CONTAINER_TOOL) (needs a container engine; none runs on the CI machines).
	$(CONTAINER_TOOL) build --build-arg GO_BUILD_FLAGS="$(GO_BUILD_FLAGS)" -t $(IMG) .

.PHONY: vet
vet:
	$(GO) vet ./...

.PHONY: fmt-check
fmt-check: ## Fail when a Go file is not gofmt-formatted.
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi

.PHONY: lint
lint: ## Run golangci-lint with .golangci.yml.
	@hack/build-tool.sh golangci-lint
	$(BIN)/golangci-lint run ./...

##@ Test

.PHONY: test
test: tools verify-gen fmt-check vet ## Every test, against a real kube-apiserver and etcd built into bin/.
	$(GO) test -timeout $(TEST_TIMEOUT) -count=1 ./... $(if $(GINKGO_FLAGS),-args $(GINKGO_FLAGS),)

##@ Local control plane

.PHONY: run
run: tools build manifests ## Local control plane + CRD + manager in the foreground; Ctrl-C stops all.
	$(GO) build -o $(BIN)/devcluster ./hack/devcluster
	exec $(BIN)/devcluster --dir .dev --manager $(BIN)/manager

.PHONY: dev-up
dev-up: tools build manifests ## The same in the background; kubeconfig at .dev/kubeconfig.
	@hack/dev-up.sh

.PHONY: bench
bench: tools build ## Benchmark report (BENCH_QUICK=1 for a short run); writes .bench/report.json.
	$(GO) run ./test/bench

.PHONY: demo
demo: ## Replay the seed's report handoff with real processes (starts dev-up if needed).
	@hack/demo.sh

.PHONY: dev-down
dev-down: ## Stop what dev-up started.
	@hack/dev-down.sh

.PHONY: clean
clean:
	rm -rf .dev

.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
