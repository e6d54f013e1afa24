# llm-scheduler: every target bootstraps what it needs (.venv for the project, .cache/engines for real engines).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINE ?= sim
export PYTHONUNBUFFERED := 1

.PHONY: help venv protos docs words buf check lint typecheck imports deploy-lint test test-fast engines http-node run demo bench bench-check clean

help:
	@echo "make run [ENGINE=sim|vllm|llamacpp]  start an engine and the scheduler on 127.0.0.1:50051"
	@echo "make run-cluster                       Redis, the simulator and three scheduler replicas (:50051-50053)"
	@echo "make test                              the whole suite, real engines included (installs them once)"
	@echo "make check                             fast inner loop: lint, types, import layers, generated code and docs, word check, tests without real engines"
	@echo "make demo                              scenario S1: a flood and two latecomers, direct vs scheduled"
	@echo "make bench [ENGINE=sim|vllm|llamacpp]  scenarios side by side; a record in bench/results/records, tables in docs/benchmarks.md"
	@echo "make bench-check                       fails when a scenario misses its target beyond tolerance"
	@echo "make bench-cluster                     C1 C3 C4 C6 CB (one process vs 3 replicas), CL CN (the leader's cost)"
	@echo "make protos                            regenerate llmsched/ (the Python API package) from protos/"
	@echo "make docs                              regenerate the docs' generated parts (error table, config reference, results)"
	@echo "make buf                               buf lint + buf breaking (against main) on protos/"
	@echo "make deploy-lint                       hadolint on the Dockerfile, deploy/kubernetes/ against Kubernetes' schemas"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

# The generated parts of docs/ and the README: the error table, the config reference, the scenarios and their
# latest records. `gen_docs.py --check` (in `make check`) also holds configs/example.toml to the config schema.
docs: $(STAMP)
	$(BIN)/python scripts/gen_docs.py

# No file speaks of how the product was built (work sessions, issue numbers, dates): scripts/check_words.py.
words:
	$(PYTHON) scripts/check_words.py

# buf (lint and breaking-change check of protos/) from the npm package @bufbuild/buf, pinned, in .cache/buf.
BUF_VERSION := 1.75.0
BUF_DIR := .cache/buf
BUF := $(BUF_DIR)/node_modules/.bin/buf
BUF_STAMP := $(BUF_DIR)/.installed-$(BUF_VERSION)
# `buf breaking` guards the API on main: a change here must not break what main serves (a breaking change
# needs a v2 package). Override to compare with another ref, e.g. BUF_AGAINST='.git#tag=v1.0.0,subdir=protos'.
# A clone without a local main (a detached CI checkout) compares with its own HEAD.
BUF_BASE := $(shell git rev-parse --verify -q refs/heads/main >/dev/null && echo branch=main || echo ref=HEAD)
BUF_AGAINST ?= $(shell git rev-parse --git-common-dir)\#$(BUF_BASE),subdir=protos

$(BUF_STAMP):
	command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q nodejs npm; }
	npm install --prefix $(BUF_DIR) --no-audit --no-fund --silent @bufbuild/buf@$(BUF_VERSION)
	touch $@

buf: $(BUF_STAMP)
	cd protos && ../$(BUF) lint
	$(BUF) breaking protos --against '$(BUF_AGAINST)'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The layers (faces -> core -> backend port <- adapters) and no cycles: contracts in pyproject.toml.
imports: $(STAMP)
	$(BIN)/lint-imports

# The container recipe (hadolint) and the Kubernetes manifests against Kubernetes' own schemas, strict, for the
# oldest release they need (1.30: the preStop sleep action) and the newest the validator ships; both tools come
# from the dev extras and run offline (no container runtime, no cluster). The custom resources in
# deploy/kubernetes/examples (PodMonitor, KEDA ScaledObject) have no schema there (--no-warn): tests/deploy checks
# them, and every manifest against the service's config, ports and metrics.
K8S_MANIFESTS := deploy/kubernetes/*.yaml deploy/kubernetes/examples/*.yaml
deploy-lint: $(STAMP)
	$(BIN)/hadolint Dockerfile
	$(BIN)/kubernetes-validate --strict --quiet --no-warn -k 1.30.0 $(K8S_MANIFESTS)
	$(BIN)/kubernetes-validate --strict --quiet --no-warn $(K8S_MANIFESTS)

# Clients in other languages, each bootstrapped by its own script on a fresh machine:
# node-client: the Node client (clients/node): node and npm when missing, npm ci, code generated from protos/, tsc;
#   tests/clients/test_node_client.py runs its tests against a live scheduler.
# go-client: the Go client (clients/go): Debian's Go toolchain and protoc plugins (apt), code generated from
#   protos/, GOPATH build; under `make test` its live test fails rather than skips without Go.
# http-node: the pinned `openai` npm package for tests/http/test_node_sdk.py (the HTTP door through the official
#   Node SDK); under `make test` that test fails instead of skipping when the package is missing.
# redis: Debian's redis-server when missing (scripts/redis_setup.sh); the cluster tests start their own on free
#   ports, and under `make test` fail rather than skip without it.
.PHONY: node-client go-client http-node redis run-cluster
node-client:
	bash clients/node/bootstrap.sh
go-client:
	bash clients/go/bootstrap.sh
http-node:
	bash scripts/http_node_setup.sh
redis:
	bash scripts/redis_setup.sh
test: export LLMSCHED_REQUIRE_GO = 1
test: export LLMSCHED_REQUIRE_NODE_SDK = 1
test: export LLMSCHED_REQUIRE_REDIS = 1

check: lint typecheck imports deploy-lint buf node-client http-node redis words
	$(BIN)/python scripts/gen_protos.py --check
	$(BIN)/python scripts/gen_docs.py --check
	LLMSCHED_SKIP_ENGINES=1 $(BIN)/pytest -q -m "not engines"

engines: $(STAMP)
	bash engines/scripts/install_vllm.sh
	bash engines/scripts/install_llamacpp.sh

test: lint typecheck imports deploy-lint buf engines node-client go-client http-node redis words
	$(BIN)/python scripts/gen_protos.py --check
	$(BIN)/python scripts/gen_docs.py --check
	$(BIN)/pytest -q

test-fast: $(STAMP)
	LLMSCHED_SKIP_ENGINES=1 $(BIN)/pytest -q -m "not engines"

run: $(STAMP)
	bash scripts/run_local.sh $(ENGINE)

# Redis, the simulator and three scheduler replicas on one Redis store (gRPC :50051-50053, HTTP :8081-8083).
run-cluster: $(STAMP) redis
	bash scripts/run_cluster.sh

demo: $(STAMP)
	$(BIN)/python -m bench.tools.demo

# S1-S8 and the cluster scenarios side by side on the simulator; ENGINE=vllm: R1 (S1/S2 on the real CPU vLLM
# laid out like a GPU host, plus the "front end starved" and "all shared" layouts), S6 and S8; ENGINE=llamacpp:
# R1 on the real llama.cpp server. Pass BENCH_ARGS="--layouts gpu_host --rounds 3" to narrow. Every run writes a
# record into bench/results/records/ (commit it), and docs/benchmarks.md and the README's table are rendered
# from the latest records.
bench: $(STAMP)
	$(if $(filter vllm,$(ENGINE)),bash engines/scripts/install_vllm.sh)
	$(if $(filter llamacpp,$(ENGINE)),bash engines/scripts/install_llamacpp.sh)
	$(BIN)/python -m bench --engine $(ENGINE) $(BENCH_ARGS)
	$(BIN)/python scripts/gen_docs.py

# The cluster scenarios alone (also part of `make bench`): one scheduler process, three memory-mode replicas and
# three replicas on a private redis-server, side by side; CL and CN, what a model's leader costs per follower
# request (three replicas, then one leader under synthetic followers); results in bench/results/cluster, a
# record as above.
.PHONY: bench-cluster
bench-cluster: $(STAMP)
	$(BIN)/python -m bench --scenarios C1,C3,C4,C6,CB,CL,CN --out bench/results/cluster $(BENCH_ARGS)
	$(BIN)/python scripts/gen_docs.py

# Fails when a scenario falls below its target (docs/benchmarks.md) by more than the stated tolerance.
bench-check: $(STAMP)
	$(BIN)/python -m bench --engine $(ENGINE) --check

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
