"""The platform's services as supervised components, each with a real readiness probe.

They reuse `infra.localstack`'s process supervision (pid files, logs, clean
stop); what they add is how each service is configured (environment overrides
of its own config keys) and how we know it is ready:

- exchange simulator: answers `GET /api/v3/ping`;
- relay: `GET /healthz` is 200;
- pipeline: wrote its ready file (every streaming query runs, PUB bound) and the
  relay accepts history (its heartbeat reached the relay: relay metric);
- ingestor: the relay sees its subscription to the exchange prefix (relay metric),
  and Iceberg `market.markets` has rows of every exchange it serves (the pipeline
  stored the markets it published): `mdclient markets` answers once `make run` says
  it is running, as the README promises;
- gateway: `GET /healthz` is 200 (it connected to the relay before it listens).

Every service but the simulator (test infrastructure) also serves `GET /metrics`
and `GET /healthz` on a port of its own (`metrics_url`), as in compose.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from infra import artifacts, spark_class_archive
from infra.localstack.components import Component, NotReadyError, base_env
from infra.localstack.config import LOOPBACK, REPO_ROOT, StackConfig
from infra.localstack.endpoints import StackEndpoints
from infra.platform.config import PlatformConfig
from infra.platform.metrics import INGESTOR_SUBSCRIBED, PIPELINE_SERVES_HISTORY, metric_sample
from ingestor.venues import venue_for
from mdproto import contracts
from mdproto.tables import Markets

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
BIN = Path(sys.executable).parent


def http_get(url: str) -> tuple[int, str]:
    """GET bypassing any proxy: (status, body), an error status too; NotReadyError when
    nothing answers."""
    try:
        with _NO_PROXY.open(url, timeout=3) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise NotReadyError(f"GET {url} failed: {exc}") from exc


def _healthy(base_url: str) -> None:
    status, body = http_get(f"{base_url}/healthz")
    if status != 200:
        raise NotReadyError(f"/healthz answered HTTP {status}: {body[:200]}")


class Service(Component):
    """A platform service: knows the platform config besides the stack's."""

    def __init__(
        self, config: StackConfig, endpoints: StackEndpoints, platform: PlatformConfig
    ) -> None:
        super().__init__(config, endpoints)
        self.platform = platform
        self.service_ports = platform.ports

    @property
    def metrics_port(self) -> int | None:
        """Its `GET /metrics` and `GET /healthz` port; None where it serves none."""
        return None

    @property
    def metrics_url(self) -> str:
        """Base URL of its `/metrics` and `/healthz` ("" where it serves none)."""
        port = self.metrics_port
        return "" if port is None else f"http://{LOOPBACK}:{port}"

    def env(self, **overrides: str) -> dict[str, str]:
        """The service's environment: its config file (if any) plus key overrides."""
        env = base_env()
        config_file = REPO_ROOT / "services" / self.name / "config.yaml"
        if config_file.is_file():
            env["CONFIG_PATH"] = str(config_file)
        env.update(overrides)
        env.update(self.platform.service_env)
        env.setdefault("LOG_LEVEL", "INFO")
        env["PYTHONUNBUFFERED"] = "1"
        return env


class ExchangeSimulator(Service):
    name = "exchange-sim"

    @property
    def ports(self) -> dict[str, int]:
        return {"exchange_sim": self.service_ports.exchange_sim}

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.service_ports.exchange_sim}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        port = str(self.service_ports.exchange_sim)
        return [sys.executable, "-m", "infra.exchange_sim", "--port", port], self.env()

    def probe(self) -> None:
        status, _ = http_get(f"{self.base_url}/api/v3/ping")
        if status != 200:
            raise NotReadyError(f"ping answered HTTP {status}")


class Relay(Service):
    name = "relay"

    @property
    def ports(self) -> dict[str, int]:
        p = self.service_ports
        return {
            "client_request": p.client_request,
            "market_data": p.market_data,
            "ingestor_work": p.ingestor_work,
            "ingestor_response": p.ingestor_response,
            "ingestor_control": p.ingestor_control,
            "relay_engines": p.relay_engines,
            "relay_metrics": p.relay_metrics,
        }

    @property
    def metrics_port(self) -> int:
        return self.service_ports.relay_metrics

    def command(self) -> tuple[list[str], dict[str, str]]:
        p = self.service_ports
        env = self.env(
            RELAY_BIND_ADDRESS=f"tcp://{LOOPBACK}",
            RELAY_CLIENT_REQUEST_PORT=str(p.client_request),
            RELAY_MARKET_DATA_PUB_PORT=str(p.market_data),
            RELAY_INGESTOR_WORK_PORT=str(p.ingestor_work),
            RELAY_INGESTOR_RESPONSE_PORT=str(p.ingestor_response),
            RELAY_INGESTOR_CONTROL_PORT=str(p.ingestor_control),
            RELAY_ENGINES_PORT=str(p.relay_engines),
            RELAY_FLINK_MARKET_DATA_ENDPOINT=f"tcp://{LOOPBACK}:{p.pipeline_pub}",
            RELAY_METRICS_HOST=LOOPBACK,
            RELAY_METRICS_PORT=str(p.relay_metrics),
            RELAY_KAFKA__BOOTSTRAP_SERVERS=self.endpoints.kafka_bootstrap,
        )
        return [str(BIN / "relay")], env

    def probe(self) -> None:
        _healthy(self.metrics_url)

    @property
    def address(self) -> str:
        return f"tcp://{LOOPBACK}:{self.service_ports.client_request}"


class ReadyFileService(Service):
    """A service that says it is ready by writing a file (removed before each start)."""

    @property
    def ready_file(self) -> Path:
        return self.data_dir / "ready.json"

    def prepare(self) -> None:
        super().prepare()
        self.ready_file.unlink(missing_ok=True)


class Pipeline(ReadyFileService):
    name = "spark-pipeline"

    @property
    def ports(self) -> dict[str, int]:
        p = self.service_ports
        return {"pipeline_pub": p.pipeline_pub, "pipeline_metrics": p.pipeline_metrics}

    @property
    def metrics_port(self) -> int:
        return self.service_ports.pipeline_metrics

    def command(self) -> tuple[list[str], dict[str, str]]:
        e = self.endpoints
        jars = artifacts.spark_jars(self.config.cache_dir)
        env = self.env(
            PYSPARK_PYTHON=sys.executable,
            PIPELINE_KAFKA__BOOTSTRAP_SERVERS=e.kafka_bootstrap,
            **e.catalog_env("PIPELINE_CATALOG__"),
            PIPELINE_SPARK__MASTER=self.platform.spark_master,
            PIPELINE_SPARK__JARS=json.dumps([str(j) for j in jars]),
            # config.yaml's relative `.cache/spark` would not resolve in the data dir.
            PIPELINE_SPARK__JARS_DIR="",
            PIPELINE_CHECKPOINT_DIR=str(self.data_dir / "checkpoints"),
            PIPELINE_PUB_ENDPOINT=f"tcp://{LOOPBACK}:{self.service_ports.pipeline_pub}",
            PIPELINE_READY_FILE=str(self.ready_file),
            PIPELINE_METRICS_HOST=LOOPBACK,
            PIPELINE_METRICS_PORT=str(self.service_ports.pipeline_metrics),
        )
        spark_class_archive.apply(env, self.config.cache_dir)  # a faster driver start
        return [str(BIN / "spark-pipeline"), "run"], env

    def probe(self) -> None:
        if not self.ready_file.exists():
            raise NotReadyError("streaming queries not started yet (no ready file)")
        relay = f"http://{LOOPBACK}:{self.service_ports.relay_metrics}/metrics"
        if (metric_sample(relay, PIPELINE_SERVES_HISTORY) or 0) < 1:
            raise NotReadyError("the relay has not seen the pipeline's heartbeat yet")


class LiveEngine(ReadyFileService):
    """An extra live engine (`python -m pipeline.engine`, ADR 0014): the pipeline's own
    is engine 1; this is engine `number` (2..K) of the same consumer group. Ready once
    the group gave it its first assignment (its ready file)."""

    def __init__(
        self,
        config: StackConfig,
        endpoints: StackEndpoints,
        platform: PlatformConfig,
        number: int,
    ) -> None:
        super().__init__(config, endpoints, platform)
        self.number = number
        self.name = f"live-engine-{number}"

    @property
    def ports(self) -> dict[str, int]:
        return {"live_engine_metrics": self.metrics_port}  # its XPUB connects to the relay

    @property
    def metrics_port(self) -> int:
        return self.service_ports.live_engine_metrics + self.number - 2

    @property
    def address(self) -> str:
        return f"-> tcp://{LOOPBACK}:{self.service_ports.relay_engines}"

    def env(self, **overrides: str) -> dict[str, str]:
        env = super().env(**overrides)
        env["CONFIG_PATH"] = str(REPO_ROOT / "services" / "spark-pipeline" / "config.yaml")
        return env

    def command(self) -> tuple[list[str], dict[str, str]]:
        e = self.endpoints
        env = self.env(
            PIPELINE_KAFKA__BOOTSTRAP_SERVERS=e.kafka_bootstrap,
            **e.catalog_env("PIPELINE_CATALOG__"),
            PIPELINE_CHECKPOINT_DIR=str(self.data_dir / "checkpoints"),
            PIPELINE_LIVE__RELAY_ENGINE_ENDPOINTS=json.dumps(
                [f"tcp://{LOOPBACK}:{self.service_ports.relay_engines}"]
            ),
            PIPELINE_METRICS_HOST=LOOPBACK,
            PIPELINE_LIVE__METRICS_PORT=str(self.metrics_port),
        )
        argv = [sys.executable, "-m", "pipeline.engine", "--ready-file", str(self.ready_file)]
        return argv, env

    def probe(self) -> None:
        if not self.ready_file.exists():
            raise NotReadyError("no assignment from the live engines' group yet")


class Ingestor(Service):
    name = "ingestor"

    def __init__(
        self,
        config: StackConfig,
        endpoints: StackEndpoints,
        platform: PlatformConfig,
        exchange_url: str | None,
    ) -> None:
        super().__init__(config, endpoints, platform)
        self.exchange_url = exchange_url
        self._markets_stored = False

    @property
    def ports(self) -> dict[str, int]:
        return {"ingestor_metrics": self.service_ports.ingestor_metrics}

    @property
    def metrics_port(self) -> int:
        return self.service_ports.ingestor_metrics

    @property
    def address(self) -> str:
        return f"tcp://{LOOPBACK}:{self.service_ports.ingestor_work} (SUB)"

    def command(self) -> tuple[list[str], dict[str, str]]:
        p = self.service_ports
        overrides = {
            "INGESTOR_KAFKA__BOOTSTRAP_SERVERS": self.endpoints.kafka_bootstrap,
            "INGESTOR_RELAY_WORK_ENDPOINT": f"tcp://{LOOPBACK}:{p.ingestor_work}",
            "INGESTOR_RELAY_CONTROL_ENDPOINT": f"tcp://{LOOPBACK}:{p.ingestor_control}",
            "INGESTOR_RELAY_RESPONSE_ENDPOINT": f"tcp://{LOOPBACK}:{p.ingestor_response}",
            "INGESTOR_INGESTOR_ID": "ingestor-local-1",
            "INGESTOR_METRICS_HOST": LOOPBACK,
            "INGESTOR_METRICS_PORT": str(p.ingestor_metrics),
            **coverage_env(self.endpoints),
            # Exactly these exchanges, whatever the ingestor's config file lists.
            "INGESTOR_SERVE": ",".join(self.platform.exchanges),
            "INGESTOR_RECORDING__EXCHANGES": json.dumps(recording(self.platform)),
        }
        if self.exchange_url is not None:
            for exchange_id in self.platform.exchanges:
                section = f"INGESTOR_EXCHANGES__{exchange_id.upper()}"
                overrides[f"{section}__API_BASE_URL"] = self.exchange_url
                # The simulator takes any API key; Binance's historicalTrades (the gap
                # repairer's id cursor) needs one. Only there: a key makes ccxt sign
                # other exchanges' channels (Coinbase's book then wants a secret).
                if venue_for(exchange_id).trade_history_key:
                    overrides[f"INGESTOR_{exchange_id.upper()}_API_KEY"] = "simulator"
        return [str(BIN / "ingestor")], self.env(**overrides)

    def probe(self) -> None:
        # Its own health first: the relay's count alone was met by another ingestor
        # (a test's second one) while this one, restarted, was still starting.
        _healthy(self.metrics_url)
        relay = f"http://{LOOPBACK}:{self.service_ports.relay_metrics}/metrics"
        if (metric_sample(relay, INGESTOR_SUBSCRIBED) or 0) < 1:
            raise NotReadyError("the relay has not seen an ingestor subscription yet")
        if self._markets_stored or not markets_query_on(self.platform):
            return
        stored = stored_markets(self.endpoints, self.platform.prefixes)
        if missing := [prefix for prefix in self.platform.prefixes if not stored.get(prefix)]:
            raise NotReadyError(
                f"{contracts.ICEBERG_MARKETS} has no rows of {', '.join(missing)} yet (the"
                " pipeline's markets query stores what the ingestor published)"
            )
        self._markets_stored = True  # rows are never taken away: no need to look again


def markets_query_on(platform: PlatformConfig) -> bool:
    """The pipeline's markets query runs (a test may turn it off in `service_env`)."""
    return platform.service_env.get("PIPELINE_MARKETS__ENABLED", "true").lower() != "false"


def stored_markets(endpoints: StackEndpoints, exchanges: Iterable[str]) -> dict[str, int]:
    """Rows of Iceberg `market.markets` per exchange prefix (`OKX`), as `mdclient
    markets` reads them; NotReadyError while the table or the catalog is not there."""
    from pyiceberg.catalog import load_catalog

    wanted = ", ".join(f"'{exchange}'" for exchange in exchanges)  # prefixes: A-Z, 0-9
    try:
        catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
        table = catalog.load_table(contracts.ICEBERG_MARKETS)
        rows = table.scan(
            row_filter=f"{Markets.EXCHANGE} IN ({wanted})", selected_fields=(Markets.EXCHANGE,)
        ).to_arrow()
    except Exception as exc:  # the catalog or S3 not answering, the table not created yet
        raise NotReadyError(f"reading {contracts.ICEBERG_MARKETS} failed: {exc}") from exc
    counts: dict[str, int] = {}
    for exchange in rows.column(Markets.EXCHANGE).to_pylist():
        counts[exchange] = counts.get(exchange, 0) + 1
    return counts


def recording(platform: PlatformConfig) -> dict[str, Any]:
    """The ingestor's `recording.exchanges`: `platform.record` on every served exchange."""
    if not platform.record:
        return {}
    wanted = {"markets": list(platform.record), "channels": ["trades", "book"]}
    return {exchange_id: wanted for exchange_id in platform.exchanges}


def client_env(request: str, market_data: str, s: StackEndpoints) -> dict[str, str]:
    """`mdclient` configuration (MDCLIENT_* environment) for a platform's relay and stack."""
    return {
        "MDCLIENT_REQUEST_ENDPOINT": request,
        "MDCLIENT_MARKET_DATA_ENDPOINT": market_data,
        "MDCLIENT_CATALOG_NAME": s.catalog_name,
        "MDCLIENT_CATALOG_URI": s.catalog_uri,
        "MDCLIENT_WAREHOUSE": s.warehouse,
        "MDCLIENT_S3_ENDPOINT": s.s3_endpoint,
        "MDCLIENT_S3_ACCESS_KEY": s.s3_access_key,
        "MDCLIENT_S3_SECRET_KEY": s.s3_secret_key,
        "MDCLIENT_S3_REGION": s.s3_region,
    }


class Gateway(Service):
    """The WebSocket/HTTP gateway and its chart page: an SDK client of the relay."""

    name = "gateway"

    @property
    def ports(self) -> dict[str, int]:
        p = self.service_ports
        return {"gateway": p.gateway, "gateway_metrics": p.gateway_metrics}

    @property
    def metrics_port(self) -> int:
        return self.service_ports.gateway_metrics

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.service_ports.gateway}"

    @property
    def address(self) -> str:
        return f"{self.url}/"

    def command(self) -> tuple[list[str], dict[str, str]]:
        p = self.service_ports
        relay = f"tcp://{LOOPBACK}"
        env = self.env(
            GATEWAY_HOST=LOOPBACK,
            GATEWAY_PORT=str(p.gateway),
            GATEWAY_METRICS_HOST=LOOPBACK,
            GATEWAY_METRICS_PORT=str(p.gateway_metrics),
            GATEWAY_TICKERS=",".join(f"{x}:BTC/USDT,{x}:ETH/USDT" for x in self.platform.prefixes),
            **client_env(f"{relay}:{p.client_request}", f"{relay}:{p.market_data}", self.endpoints),
        )
        return [str(BIN / "gateway")], env

    def probe(self) -> None:
        _healthy(self.url)


def coverage_env(e: StackEndpoints) -> dict[str, str]:
    """The ingestor answers stored ranges from the stack's Iceberg (ingestor/coverage.py)."""
    return {"INGESTOR_COVERAGE__ENABLED": "true", **e.catalog_env("INGESTOR_COVERAGE__CATALOG__")}
