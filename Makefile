# make venv   create .venv and install tracejit (editable) with its test extras
# make test   run the test suite, then every script in examples/
# make demo   the tour: eager vs jit on one program
# make bench  the benchmarks (benchmarks/run.py)
# make fuzz   random programs jit vs eager (make fuzz-quick: a short run); see below

PYTHON_BOOTSTRAP := $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test demo bench fuzz fuzz-quick

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

# make fuzz        differential fuzzing, deep: 2000 random programs jit vs eager, one worker
#                  per core; failing programs are written to fuzz-out/ as reproducers
# make fuzz-quick  the same, 100 programs
FUZZ_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

fuzz: venv
	$(PY) -m tracejit.testing.fuzz --programs 2000 --jobs $(FUZZ_JOBS) --seed 0 --timeout 60 --out fuzz-out

fuzz-quick: venv
	$(PY) -m tracejit.testing.fuzz --programs 100 --jobs $(FUZZ_JOBS) --seed 1 --timeout 60 --out fuzz-out --quiet
