# Every target sets up what it needs: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
PROTOS := $(shell find protos -name '*.proto')
STAMP_VENV := $(VENV)/.installed
STAMP_PROTO := strata/proto/.generated
STAMP_MODELS := build/.models

.PHONY: venv proto models run test lint fmt bench clean

venv: $(STAMP_VENV)
$(STAMP_VENV): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

proto: $(STAMP_PROTO)
$(STAMP_PROTO): $(STAMP_VENV) $(PROTOS) scripts/gen_protos.py
	$(PY) scripts/gen_protos.py
	touch $@

models: $(STAMP_MODELS)
$(STAMP_MODELS): $(STAMP_PROTO) $(shell find models -name '*.py') $(shell find services/preprocess -name '*.py')
	$(PY) -m models.build --out build
	touch $@

run: $(STAMP_MODELS)
	$(PY) -m strata.launch --config $(CONFIG)

test: $(STAMP_MODELS) lint
	$(PY) -m pytest

lint: $(STAMP_PROTO)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

fmt: $(STAMP_VENV)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(STAMP_MODELS)
	$(PY) -m bench --config $(CONFIG)

clean:
	rm -rf build strata/proto/inference strata/proto/v1 $(STAMP_PROTO)
