# llm-scheduler: every target bootstraps what it needs (.venv for the project, .cache/engines for real engines).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINE ?= sim
export PYTHONUNBUFFERED := 1

.PHONY: help venv protos buf check lint typecheck imports test test-fast engines http-node run demo bench bench-check clean

help:
	@echo "make run [ENGINE=sim|vllm|llamacpp]  start an engine and the scheduler on 127.0.0.1:50051"
	@echo "make run-cluster                       Redis, the simulator and three scheduler replicas (:50051-50053)"
	@echo "make test                              the whole suite, real engines included (installs them once)"
	@echo "make check                             fast inner loop: lint, types, import layers, generated code, tests without real engines"
	@echo "make demo                              scenario S1: a flood and two latecomers, direct vs scheduled"
	@echo "make bench [ENGINE=sim|vllm|llamacpp]  scenarios side by side, tables + JSON + plots in bench/results"
	@echo "make bench-check                       fails when a scenario misses its target beyond tolerance"
	@echo "make bench-cluster                     C1 C3 C4 C6 CB (one process vs 3 replicas), CL CN (the leader's cost)"
	@echo "make protos                            regenerate llmsched/ (Python API package) and README's error table"
	@echo "make buf                               buf lint + buf breaking (against main) on protos/"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

# buf (lint and breaking-change check of protos/) from the npm package @bufbuild/buf, pinned, in .cache/buf.
BUF_VERSION := 1.75.0
BUF_DIR := .cache/buf
BUF := $(BUF_DIR)/node_modules/.bin/buf
BUF_STAMP := $(BUF_DIR)/.installed-$(BUF_VERSION)
# `buf breaking` guards the API on main: a change here must not break what main serves. The one exception was
# issue 11, which reshaped v1 in place once before any client was released (its branch failed this check
# against the old main by design); from its merge on, main's proto is the baseline. Override to compare with
# another ref, e.g. BUF_AGAINST='.git#tag=v1.0.0,subdir=protos'.
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

check: lint typecheck imports buf node-client http-node redis
	$(BIN)/python scripts/gen_protos.py --check
	LLMSCHED_SKIP_ENGINES=1 $(BIN)/pytest -q -m "not engines"

engines: $(STAMP)
	bash engines/scripts/install_vllm.sh
	bash engines/scripts/install_llamacpp.sh

test: lint typecheck imports buf engines node-client go-client http-node redis
	$(BIN)/python scripts/gen_protos.py --check
	$(BIN)/pytest -q

test-fast: $(STAMP)
	LLMSCHED_SKIP_ENGINES=1 $(BIN)/pytest -q -m "not engines"

run: $(STAMP)
	bash scripts/run_local.sh $(ENGINE)

# Redis, the simulator and three scheduler replicas on one Redis store (gRPC :50051-50053, HTTP :8081-8083).
run-cluster: $(STAMP) redis
	bash scripts/run_cluster.sh

demo: $(STAMP)
	$(BIN)/python -m bench.s1_demo

# S1-S8 side by side on the simulator (refreshes README's Results); ENGINE=vllm: R1 (S1/S2 on the real CPU
# vLLM laid out like a GPU host, plus the "front end starved" and "all shared" layouts) and S6;
# ENGINE=llamacpp: R1 on the real llama.cpp server. Pass BENCH_ARGS="--layouts gpu_host --rounds 3" to narrow.
bench: $(STAMP)
	$(if $(filter vllm,$(ENGINE)),bash engines/scripts/install_vllm.sh)
	$(if $(filter llamacpp,$(ENGINE)),bash engines/scripts/install_llamacpp.sh)
	$(BIN)/python -m bench --engine $(ENGINE) $(BENCH_ARGS)
	$(if $(filter sim,$(ENGINE)),$(BIN)/python bench/update_readme.py)

# The cluster scenarios alone (also part of `make bench`): one scheduler process, three memory-mode replicas
# (before) and three replicas on a private redis-server (after), side by side; CL and CN, what a model's leader
# costs per follower request (three replicas, then one leader under synthetic followers); results in
# bench/results/cluster.
.PHONY: bench-cluster
bench-cluster: $(STAMP)
	$(BIN)/python -m bench --scenarios C1,C3,C4,C6,CB,CL,CN --out bench/results/cluster $(BENCH_ARGS)

# Fails when a scenario falls below its SCENARIOS.md target by more than the stated tolerance.
bench-check: $(STAMP)
	$(BIN)/python -m bench --engine $(ENGINE) --check

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
