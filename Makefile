# The few commands a person needs. The README's two commands are `make demo` and `make test`;
# .ci/run calls `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# The SAM CLI, in a venv of its own (requirements-sam.txt says why). SAM_CLI_TELEMETRY=0: it
# sends nothing about the build anywhere.
SAM_VENV  := .venv-sam
SAM       := SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam
SAM_STAMP := $(SAM_VENV)/.installed

.PHONY: setup demo demo-sandbox test test-fast lint bench screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(SAM_STAMP): requirements-sam.txt
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet --upgrade pip
	$(SAM_VENV)/bin/pip install --quiet -r requirements-sam.txt
	touch $(SAM_STAMP)

setup: $(STAMP) $(SAM_STAMP)
	-@sh scripts/system-packages.sh

demo: $(STAMP)
	$(BIN)/laneflow demo

# The second demo: a sandboxed agent runs a script with a declared secret (examples/tides).
demo-sandbox: $(STAMP)
	$(BIN)/laneflow demo tides

# sam validate --lint: the template as SAM transforms it, linted by SAM's own cfn-lint. It
# needs a region, no credentials and no network.
lint: $(STAMP) $(SAM_STAMP)
	$(BIN)/ruff format --check layers devtools functions bench tests scripts setup.py
	$(BIN)/ruff check layers devtools functions bench tests scripts setup.py
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/cfn-lint template.yaml
	$(BIN)/statelint statemachines/*.asl.json
	$(SAM) validate --lint --region us-east-1 --template-file template.yaml

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
	rm -rf $(VENV) $(SAM_VENV) .laneflow .pytest_cache .aws-sam
