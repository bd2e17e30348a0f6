"""Settings: YAML at CONFIG_PATH, INGESTOR_* env overrides, secrets from the environment only."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ingestor.config import credentials_for, load_settings
from mdproto import contracts

CONFIG_YAML = Path(__file__).resolve().parents[1] / "config.yaml"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("INGESTOR_") or name in ("CONFIG_PATH", "LOG_LEVEL"):
            monkeypatch.delenv(name)


def test_defaults_come_from_the_contracts() -> None:
    s = load_settings()
    assert s.kafka.topic_ohlc_batches == contracts.KAFKA_OHLC_BATCHES
    assert s.kafka.topic_ticks == contracts.KAFKA_TICKS
    assert s.kafka.topic_markets == contracts.KAFKA_MARKETS
    assert s.kafka.topic_claims == "ingest.claims"
    assert s.relay_work_endpoint.endswith(":5555")
    assert s.relay_control_endpoint.endswith(":5560")
    assert s.relay_response_endpoint.endswith(":5556")
    assert s.exchanges["binance"].prefix == "BINANCE"


def test_shipped_config_yaml_matches_the_code_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIG_PATH", str(CONFIG_YAML))
    from_yaml = load_settings().model_dump(exclude={"ingestor_id"})
    monkeypatch.delenv("CONFIG_PATH")
    assert from_yaml == load_settings().model_dump(exclude={"ingestor_id"})


def test_yaml_then_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "ingestor_id: from-yaml\n"
        "kafka: {bootstrap_servers: 'yaml:1', topic_ticks: t.yaml}\n"
        "exchanges:\n  binance: {prefix: BINANCE, api_base_url: 'http://127.0.0.1:1'}\n"
    )
    monkeypatch.setenv("CONFIG_PATH", str(path))
    monkeypatch.setenv("INGESTOR_KAFKA__BOOTSTRAP_SERVERS", "env:2")
    monkeypatch.setenv("INGESTOR_HISTORY__BATCH_SIZE", "77")
    s = load_settings()
    assert s.ingestor_id == "from-yaml"
    assert s.kafka.bootstrap_servers == "env:2"  # env wins
    assert s.kafka.topic_ticks == "t.yaml"  # the rest of the section stays
    assert s.history.batch_size == 77
    assert s.exchanges["binance"].api_base_url == "http://127.0.0.1:1"


def test_missing_config_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIG_PATH", "/nonexistent/ingestor.yaml")
    with pytest.raises(FileNotFoundError, match="CONFIG_PATH"):
        load_settings()


@pytest.mark.parametrize(
    "yaml_text",
    [
        "exchanges: {binance: {prefix: BINANCE, api_key: leaked}}\n",  # keys never in YAML
        "exchanges: {binance: {prefix: 'binance:'}}\n",
        "exchanges: {}\n",
        "exchanges: {binance: {prefix: X}, okx: {prefix: X}}\n",
        "exchanges: {binance: {prefix: OKX}}\nserve: [binance, okx]\n",  # okx defaults to OKX
        "serve: []\n",
        "history: {batch_size: 0}\n",
        "no_such_key: 1\n",
    ],
)
def test_bad_config_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    monkeypatch.setenv("CONFIG_PATH", str(path))
    with pytest.raises(ValidationError):
        load_settings()


def test_an_ingestor_serves_the_exchanges_it_is_told_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("exchanges: {binance: {prefix: BINANCE}, okx: {page_limit: 100}}\n")
    monkeypatch.setenv("CONFIG_PATH", str(path))
    served = load_settings().served()
    assert {i: (e.prefix, e.page_limit) for i, e in served.items()} == {
        "binance": ("BINANCE", 1000),
        "okx": ("OKX", 100),  # the venue's prefix
    }
    monkeypatch.setenv("INGESTOR_SERVE", "okx,kraken")  # no Binance, whatever the file says
    served = load_settings().served()
    assert {i: (e.prefix, e.page_limit) for i, e in served.items()} == {
        "okx": ("OKX", 100),
        "kraken": ("KRAKEN", 1000),
    }
    monkeypatch.setenv("INGESTOR_SERVE", "")  # empty: everything configured
    assert list(load_settings().served()) == ["binance", "okx"]


def test_api_keys_come_from_the_environment_and_are_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INGESTOR_BINANCE_API_KEY", "k-123")
    monkeypatch.setenv("INGESTOR_BINANCE_SECRET", "s-456")
    load_settings()  # unrelated INGESTOR_* variables do not break the settings
    creds = credentials_for("binance")
    assert creds.ccxt_config() == {"apiKey": "k-123", "secret": "s-456"}
    assert "k-123" not in repr(creds) and "s-456" not in str(creds)
    assert credentials_for("okx").ccxt_config() == {}


def test_several_relays_as_a_list_or_comma_separated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Active/active relays: every socket lists the same relays, in the same order."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "relay_work_endpoint: [tcp://a:5555, tcp://b:5555]\n"
        "relay_control_endpoint: [tcp://a:5560, tcp://b:5560]\n"
        "relay_response_endpoint: [tcp://a:5556, tcp://b:5556]\n"
    )
    monkeypatch.setenv("CONFIG_PATH", str(path))
    s = load_settings()
    assert s.relays("work") == ["tcp://a:5555", "tcp://b:5555"]
    assert s.relays("response") == ["tcp://a:5556", "tcp://b:5556"]
    monkeypatch.setenv("INGESTOR_RELAY_CONTROL_ENDPOINT", "tcp://a:5560")  # one relay short
    with pytest.raises(ValidationError, match="same relays"):
        load_settings()
