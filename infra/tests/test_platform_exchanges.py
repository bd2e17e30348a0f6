"""`make run` for chosen exchanges: what the platform tells the relay and the ingestor;
and where every service serves `/metrics` and `/healthz`.

No process is started: the environment each service would get is fed to that
service's own settings loader, so the chain config -> env -> settings is real.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra import artifacts
from infra.localstack import StackConfig
from infra.localstack.endpoints import StackEndpoints
from infra.localstack.process import StackError
from infra.platform.config import PlatformConfig, ServicePorts
from infra.platform.services import Gateway, Ingestor, LiveEngine, Pipeline, Relay
from infra.platform.supervisor import Platform
from ingestor.venues import venue_for
from ingestor.venues.base import HistoryUnavailableError

ENDPOINTS = StackEndpoints(
    kafka_bootstrap="127.0.0.1:1",
    s3_endpoint="http://127.0.0.1:2",
    s3_access_key="a",
    s3_secret_key="s",
    s3_region="r",
    s3_bucket="b",
    warehouse="s3://b/w",
    catalog_uri="http://127.0.0.1:3",
    catalog_name="c",
)


def service_env(
    component: type[Relay | Ingestor | Pipeline | Gateway],
    platform: PlatformConfig,
    **kw: str | None,
) -> dict[str, str]:
    config = StackConfig.load(data_dir=platform.data_dir)
    service = component(config, ENDPOINTS, platform, **kw)
    return service.command()[1]


def test_exchanges_come_from_the_environment_as_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATFORM_EXCHANGES", "OKX, kraken")
    config = PlatformConfig()
    assert (config.exchanges, config.prefixes) == (["okx", "kraken"], ["OKX", "KRAKEN"])
    with pytest.raises(ValueError, match="at least one exchange"):
        PlatformConfig(exchanges=[" "])


def test_a_platform_without_binance_configures_the_ingestor_for_okx_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ingestor.config import load_settings as ingestor_settings
    from relay.config import load_settings as relay_settings

    platform = PlatformConfig(exchanges=["okx"], exchange="real")
    for key, value in service_env(Relay, platform).items():
        monkeypatch.setenv(key, value)
    assert relay_settings().known_exchanges == []  # routes whatever the ingestors serve
    for key, value in service_env(Ingestor, platform, exchange_url=None).items():
        monkeypatch.setenv(key, value)  # CONFIG_PATH: the shipped file, which lists Binance
    served = ingestor_settings().served()
    assert {i: s.prefix for i, s in served.items()} == {"okx": "OKX"}
    assert served["okx"].api_base_url is None  # the real exchange


def test_simulated_exchanges_point_at_the_simulator_and_others_are_refused() -> None:
    platform = PlatformConfig(exchanges=["binance", "coinbaseexchange"])
    env = service_env(Ingestor, platform, exchange_url="http://127.0.0.1:8765")
    assert env["INGESTOR_SERVE"] == "binance,coinbaseexchange"
    assert env["INGESTOR_EXCHANGES__COINBASEEXCHANGE__API_BASE_URL"] == "http://127.0.0.1:8765"
    assert env["INGESTOR_EXCHANGES__BINANCE__API_BASE_URL"] == "http://127.0.0.1:8765"
    assert "INGESTOR_EXCHANGES__BINANCE__CONSECUTIVE_TRADE_IDS" not in env  # 1, 2, 3, ...
    assert env["INGESTOR_BINANCE_API_KEY"] == "simulator"  # historicalTrades needs one
    assert "INGESTOR_COINBASEEXCHANGE_API_KEY" not in env  # it would sign the book channel
    # BTC, ETH and SOL recorded on every served exchange (PLATFORM_RECORD).
    recording = json.loads(env["INGESTOR_RECORDING__EXCHANGES"])
    assert set(recording) == {"binance", "coinbaseexchange"}
    assert recording["binance"] == {
        "markets": ["BTC/USDT", "ETH/USDT", "SOL/USDT"],
        "channels": ["trades", "book"],
    }
    quiet = service_env(Ingestor, PlatformConfig(record=[]), exchange_url=None)
    assert json.loads(quiet["INGESTOR_RECORDING__EXCHANGES"]) == {}
    with pytest.raises(
        StackError, match="simulator speaks only binance, bybit, coinbaseexchange, kraken, okx"
    ):
        Platform(PlatformConfig(exchanges=["okx", "gateio"]), use_simulator=True)
    for exchange_id in ("okx", "kraken", "coinbaseexchange"):  # wire formats it speaks
        alone = Platform(PlatformConfig(exchanges=[exchange_id]), use_simulator=True)
        assert alone.exchange_url is not None


def test_the_demo_request_asks_each_exchange_for_a_range_it_serves() -> None:
    """`make run`'s request: Kraken serves only its latest 720 one-minute entries."""
    from infra.platform.__main__ import default_start
    from mdclient.timeparse import parse_time

    now = 1_700_000_000_000
    for exchange_id in ("binance", "okx", "bybit", "kraken", "coinbaseexchange"):
        start = parse_time(default_start(exchange_id), now_ms=now)
        venue_for(exchange_id).check_history(start, now, 60_000)  # raises if refused
    assert default_start("okx") == "-24h"
    with pytest.raises(HistoryUnavailableError):
        venue_for("kraken").check_history(now - 24 * 3_600_000, now, 60_000)


def test_every_service_gets_its_own_metrics_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each service's own loader reads the port `make run` gives it (its config file says
    0, off), and `status` lists every service's /metrics and /healthz."""
    from gateway.config import load as gateway_settings
    from infra.platform.__main__ import metrics_lines
    from ingestor.config import load_settings as ingestor_settings
    from pipeline.config import load_settings as pipeline_settings
    from relay.config import load_settings as relay_settings

    monkeypatch.setattr(artifacts, "spark_jars", lambda cache=None: [])  # no download
    ports = ServicePorts.free()
    platform = PlatformConfig(data_dir=tmp_path, ports=ports)
    loaders: list[tuple[type[Relay | Ingestor | Pipeline | Gateway], Callable[[], Any], int]] = [
        (Relay, relay_settings, ports.relay_metrics),
        (Pipeline, pipeline_settings, ports.pipeline_metrics),
        (Ingestor, ingestor_settings, ports.ingestor_metrics),
        (Gateway, gateway_settings, ports.gateway_metrics),
    ]
    for component, load, port in loaders:
        kw = {"exchange_url": None} if component is Ingestor else {}
        with monkeypatch.context() as m:
            for key, value in service_env(component, platform, **kw).items():
                m.setenv(key, value)
            settings = load()
        assert (settings.metrics_host, settings.metrics_port) == ("127.0.0.1", port), component

    running = Platform(platform, use_simulator=True)  # nothing started: no `up()`
    urls = running.metrics_urls()
    assert urls == {
        "relay": f"http://127.0.0.1:{ports.relay_metrics}",
        "spark-pipeline": f"http://127.0.0.1:{ports.pipeline_metrics}",
        "ingestor": f"http://127.0.0.1:{ports.ingestor_metrics}",
        "gateway": f"http://127.0.0.1:{ports.gateway_metrics}",
    }
    lines = metrics_lines(running).splitlines()[1:]
    assert [line.split() for line in lines] == [
        [name, f"{url}/metrics", f"{url}/healthz"] for name, url in urls.items()
    ]


def test_live_engines_join_the_pipelines_group_through_the_relays_engine_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`make run LIVE_ENGINES=3`: two `python -m pipeline.engine` beside the pipeline, in
    its consumer group, their XPUBs connecting to the port the relay binds for them."""
    from pipeline.config import load_settings as pipeline_settings
    from relay.config import load_settings as relay_settings

    monkeypatch.setenv("PLATFORM_LIVE_ENGINES", "3")
    monkeypatch.setattr(artifacts, "spark_jars", lambda cache=None: [])  # no download
    platform = PlatformConfig(data_dir=tmp_path, ports=ServicePorts.free())
    running = Platform(platform, use_simulator=True)  # nothing started: no `up()`
    config = StackConfig.load(data_dir=platform.data_dir)
    engines = [c for c in running._services(config, ENDPOINTS) if isinstance(c, LiveEngine)]
    assert [e.name for e in engines] == ["live-engine-2", "live-engine-3"]
    settings = []
    for component in (engines[0], Pipeline(config, ENDPOINTS, platform)):
        with monkeypatch.context() as m:
            for key, value in component.command()[1].items():
                m.setenv(key, value)
            settings.append(pipeline_settings())
    engine, pipeline = settings
    argv = engines[0].command()[0]
    assert argv[1:] == ["-m", "pipeline.engine", "--ready-file", str(engines[0].ready_file)]
    assert engine.live_group_id == pipeline.live_group_id
    assert engine.checkpoint_dir != pipeline.checkpoint_dir  # CEP's local state is per engine
    with monkeypatch.context() as m:
        for key, value in service_env(Relay, platform).items():
            m.setenv(key, value)
        relay = relay_settings()
    assert engine.live.relay_engine_endpoints == [f"tcp://127.0.0.1:{relay.engines_port}"]
    # Each engine its own /metrics (9564, 9565 by default); the pipeline's own is on its.
    assert [e.metrics_port for e in engines] == [
        platform.ports.live_engine_metrics,
        platform.ports.live_engine_metrics + 1,
    ]
    assert (engine.metrics_host, engine.live.metrics_port) == ("127.0.0.1", engines[0].metrics_port)
    assert pipeline.live.metrics_port == 0
    assert set(running.metrics_urls()) >= {"live-engine-2", "live-engine-3"}
