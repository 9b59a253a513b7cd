# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make demo` needs psrec and its dependencies only; `make test`
# (and install, bench) add the test extras -- also after a `make demo`.
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test test-fast install bench clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (set PYTHON=...)"; exit 2; }
	@echo "make: creating the virtual environment $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing psrec and its dependencies into $(VENV) (TensorFlow 2.21, tf-keras, TensorFlow Recommenders, pyarrow, ...; the first run downloads them)"
	$(BIN)/pip install -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing psrec with its test extras into $(VENV) (pytest, moto, kubernetes-validate, ...; the first run downloads them)"
	$(BIN)/pip install -e ".[test]"
	touch $(TEST_STAMP) $(RUN_STAMP)

install: $(TEST_STAMP)

demo: $(RUN_STAMP)
	$(BIN)/psrec train --workdir runs/demo

# The whole suite (CI: .ci/run), with the 25 slowest tests listed. Two test
# processes (CI has 2 cores; a test's OS processes leave a core idle much of
# the time); each module stays in one of them (--dist loadfile), so its
# fixtures -- a cluster run shared by several tests -- are made once.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: $(TEST_STAMP)
	$(PYTEST) --durations=25

# The inner loop: every test but the slow ones (each over ~10 s on 2 cores).
test-fast: $(TEST_STAMP)
	$(PYTEST) -m "not slow" --durations=10

bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/convert_bench.py

clean:
	rm -rf runs out
