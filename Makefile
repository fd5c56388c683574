# Two entry points for a fresh machine (see README):
#   make demo  -> creates .venv, installs torch==2.13.0 then par3d, trains the default 3D job
#   make test  -> creates .venv, installs the same plus test tools, runs ruff and the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: venv install demo test lint bench clean

$(PY):
	python3 -m venv $(VENV)

install: $(PY)
	# The pinned CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'

demo: install
	$(VENV)/bin/par3d train --out runs/demo --metrics-out runs/demo/metrics.jsonl

test: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q tests

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs
