# conveyor's everyday commands. CI (.ci/run) runs `make demo`, then `make test`.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: venv test demo bench soak soak-hosts lint

# The venv is (re)installed only when pyproject.toml is newer than the stamp. `make demo` needs
# conveyor alone; the test tools (pytest, selenium, linters) come with `make test` or `make venv`.
venv: $(VENV)/.installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(VENV)/.installed
	$(BIN)/python -m pip install -e '.[bench]'
	touch $@

test: venv
	$(BIN)/python -m pytest -q --durations=30 $(PYTEST_ARGS)

demo: $(VENV)/.installed-base
	$(BIN)/conveyor demo

bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench

# The fault campaign (tests/faults/test_campaign.py) on random seeds, soak size, for SOAK_SECONDS
# (default 3600); sums and failing seeds in SOAK_REPORT (default /tmp/conveyor-soak-report.md).
SOAK_SECONDS ?= 3600
SOAK_REPORT ?=
soak: venv
	SOAK_SECONDS=$(SOAK_SECONDS) SOAK_REPORT=$(SOAK_REPORT) $(BIN)/python -m tests.faults.soak

# The same, for the three-host partition test alone (tests/faults/test_hosts.py, docs/hosts.md).
soak-hosts: venv
	SOAK_TESTS=tests/faults/test_hosts.py SOAK_SECONDS=$(SOAK_SECONDS) SOAK_REPORT=$(SOAK_REPORT) \
		$(BIN)/python -m tests.faults.soak

# The house rules (issue 12): layer contracts, lint, format, types. CI runs it too.
lint: venv
	$(BIN)/lint-imports
	$(BIN)/ruff check conveyor tests bench
	$(BIN)/ruff format --check conveyor tests bench
	$(BIN)/mypy
