# make venv   create .venv and install tracejit (editable) with its test extras
# make test   run the test suite, then every script in examples/
# make demo   the tour: eager vs jit on one program
# make bench  the benchmarks (benchmarks/run.py)

PYTHON_BOOTSTRAP := $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test demo bench

venv: $(STAMP)

# Reinstalls only when pyproject.toml changes (the package itself is editable).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: venv
	$(PY) -m pytest -q tests
	set -e; for f in examples/*.py; do echo "== $$f"; $(PY) $$f; done

demo: venv
	$(PY) -m tracejit.demo

bench: venv
	$(PY) benchmarks/run.py
