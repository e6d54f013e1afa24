# llm-scheduler: every target bootstraps what it needs (.venv for the project, .cache/engines for real engines).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINE ?= sim
export PYTHONUNBUFFERED := 1

.PHONY: help venv protos check lint typecheck imports test test-fast engines run demo bench bench-check clean

help:
	@echo "make run [ENGINE=sim|vllm|llamacpp]  start an engine and the scheduler on 127.0.0.1:50051"
	@echo "make test                              the whole suite, real engines included (installs them once)"
	@echo "make check                             fast inner loop: lint, types, import layers, generated code, tests without real engines"
	@echo "make demo                              scenario S1: a flood and two latecomers, direct vs scheduled"
	@echo "make bench [ENGINE=sim|vllm|llamacpp]  scenarios side by side, tables + JSON + plots in bench/results"
	@echo "make bench-check                       fails when a scenario misses its target beyond tolerance"
	@echo "make protos                            regenerate Python code from protos/"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The layers (faces -> core -> backend port <- adapters) and no cycles: contracts in pyproject.toml.
imports: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck imports
	$(BIN)/python scripts/gen_protos.py --check
	LLMSCHED_SKIP_ENGINES=1 $(BIN)/pytest -q -m "not engines"

engines: $(STAMP)
	bash engines/scripts/install_vllm.sh
	bash engines/scripts/install_llamacpp.sh

test: lint typecheck imports engines
	$(BIN)/python scripts/gen_protos.py --check
	$(BIN)/pytest -q

test-fast: $(STAMP)
	LLMSCHED_SKIP_ENGINES=1 $(BIN)/pytest -q -m "not engines"

run: $(STAMP)
	bash scripts/run_local.sh $(ENGINE)

demo: $(STAMP)
	$(BIN)/python -m bench.s1_demo

# S1-S7 side by side on the simulator (refreshes README's Results); ENGINE=vllm: R1 (S1/S2 on the real CPU
# vLLM laid out like a GPU host, plus the "front end starved" and "all shared" layouts) and S6;
# ENGINE=llamacpp: R1 on the real llama.cpp server. Pass BENCH_ARGS="--layouts gpu_host --rounds 3" to narrow.
bench: $(STAMP)
	$(if $(filter vllm,$(ENGINE)),bash engines/scripts/install_vllm.sh)
	$(if $(filter llamacpp,$(ENGINE)),bash engines/scripts/install_llamacpp.sh)
	$(BIN)/python -m bench --engine $(ENGINE) $(BENCH_ARGS)
	$(if $(filter sim,$(ENGINE)),$(BIN)/python bench/update_readme.py)

# Fails when a scenario falls below its SCENARIOS.md target by more than the stated tolerance.
bench-check: $(STAMP)
	$(BIN)/python -m bench --engine $(ENGINE) --check

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
