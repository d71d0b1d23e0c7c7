# The few commands a person needs. The README's two commands are `make demo` and `make test`;
# .ci/run calls `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo demo-sandbox test test-fast lint bench screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)
	-@sh scripts/system-packages.sh

demo: $(STAMP)
	$(BIN)/laneflow demo

# The second demo: a sandboxed agent runs a script with a declared secret (examples/tides).
demo-sandbox: $(STAMP)
	$(BIN)/laneflow demo tides

lint: $(STAMP)
	$(BIN)/ruff format --check layers devtools functions bench tests scripts setup.py
	$(BIN)/ruff check layers devtools functions bench tests scripts setup.py
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/cfn-lint template.yaml
	$(BIN)/statelint statemachines/*.asl.json

# The suite runs on every core (pytest-xdist); `pytest` alone runs it in one process.
test: $(STAMP) lint
	$(BIN)/pytest -n auto

# The quick loop while working: no test marked slow, and the SQLite store only.
test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow" --store-backend sqlite

# The README's screenshots of the run viewer (docs/screenshots/), from real runs in Debian's
# headless Chromium (`make setup` installs it).
screenshots: $(STAMP)
	$(BIN)/python scripts/viewer_screenshots.py

bench: $(STAMP)
	$(BIN)/python bench/local_engine.py

# layers/laneflow/requirements.txt from pyproject.toml's dependencies (a unit test fails when
# the committed file is out of date).
.PHONY: layer-requirements
layer-requirements: $(STAMP)
	$(BIN)/python scripts/layer_requirements.py

clean:
	rm -rf $(VENV) .laneflow .pytest_cache
