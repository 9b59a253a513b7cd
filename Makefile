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

# The whole suite (CI: .ci/run), with the 25 slowest tests listed. Two test
# processes (CI has 2 cores; a test's OS processes leave a core idle much of
# the time); each module stays in one of them (--dist loadfile), so its
# fixtures -- a cluster run shared by several tests -- are made once.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile

test: $(STAMP)
	$(PYTEST) --durations=25

# The inner loop: every test but the slow ones (each over ~10 s on 2 cores).
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" --durations=10

bench: $(STAMP)
	$(BIN)/python benchmarks/convert_bench.py

clean:
	rm -rf runs out
