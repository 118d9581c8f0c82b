# decodebench: `make demo` runs the demo sweep end to end; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_WORKERS ?= 2
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: help install demo serve-demo test test-fast services lint format typecheck bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[build,server,agent,embedded,dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install every role and the dev tools

demo: install  ## the demo sweep (SmolLM2-135M, fetched once) with its speed table and answers
	$(BIN)/python -m scripts.demo --speak

serve-demo: install  ## the demo, then keep the server and UI up until Ctrl-C
	$(BIN)/python -m scripts.demo --speak --serve

services:  ## start PostgreSQL and Redis if they are not running; install Chromium if missing
	bash scripts/services.sh

test: install services lint  ## lint, then every test, against the real PostgreSQL, Redis and Chromium
	$(BIN)/python -m pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=15

test-fast: install services  ## the tests that convert no model and start no browser
	$(BIN)/python -m pytest -m "not slow and not browser"

lint: install  ## ruff check, ruff format check, and mypy over every package
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format:  ## ruff format and fix
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: install  ## mypy over every package (decodebench, agent, server, worker)
	$(BIN)/mypy

bench:  ## full-size EXAONE benchmarks, one after another (tens of minutes, up to ~10 GB RAM each)
	$(BIN)/python -m bench.exaone_tiles
	$(BIN)/python -m bench.build_exaone
	$(BIN)/python -m bench.fold_exaone
	$(BIN)/python -m bench.diff_exaone
	$(BIN)/python -m bench.host_decode

clean:  ## remove local state (embedded database, artifacts, logs)
	rm -rf var
