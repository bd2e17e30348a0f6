# Docker Compose platform: one image per service on one network (docs/docker.md).
# Included by the top-level Makefile (`include infra/compose/compose.mk`); it uses
# that Makefile's $(BIN) and its `venv` and `proto` targets.
#
#   make up [OFFLINE=1]         build the images, start the platform, wait until healthy
#                               (OFFLINE=1: exchange simulator instead of the real Binance)
#   make down [PURGE=1]         stop and remove the containers (PURGE=1: the volumes too)
#   make logs [SERVICE=relay]   follow the logs of every (or one) service
#   make e2e                    the end-to-end suite against the compose stack (testcontainers);
#                               skips with a one-line reason where no Docker engine runs
#   make compose-config         validate docker-compose.yml offline (no engine needed)

COMPOSE ?= docker compose
COMPOSE_UP_FLAGS := $(if $(OFFLINE),--profile offline)
E2E_ARGS ?=

.PHONY: up down logs e2e compose-config

up:
	$(COMPOSE) $(COMPOSE_UP_FLAGS) up --detach --build --wait

down:
	$(COMPOSE) --profile offline --profile client down --remove-orphans $(if $(PURGE),--volumes)

logs:
	$(COMPOSE) --profile offline logs --follow --tail=200 $(SERVICE)

compose-config: venv
	$(BIN)/docker-compose --profile offline --profile client config --quiet

# The build runs here, outside pytest's per-test timeout; the fixture's own
# `up --build` then finds every layer cached.
e2e: venv proto
	@if docker info >/dev/null 2>&1; then \
		$(COMPOSE) --profile offline build; \
	else \
		echo "e2e: no Docker engine here, the compose e2e tests will skip"; \
	fi
	MDP_E2E_STACK=compose $(BIN)/pytest -m e2e --timeout=3600 e2e infra/tests/test_compose.py $(E2E_ARGS)
