# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast install bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/psrec train --workdir runs/demo

# The whole suite (CI: .ci/run), with the 25 slowest tests listed.
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25

# The inner loop: every test but the slow ones (each over ~10 s on 2 cores).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=10

bench: $(STAMP)
	$(BIN)/python benchmarks/convert_bench.py

clean:
	rm -rf runs out
