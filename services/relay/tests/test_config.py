"""Config loading: the spec's exact file, the packaged defaults, env overrides."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from relay.config import RelaySettings, load_settings

HERE = Path(__file__).parent
# shared/spec/000, "Configuration", verbatim.
SPEC_CONFIG = """\
bind_address: "tcp://*"
client_request_port: 5559
market_data_pub_port: 5558
ingestor_work_port: 5555
ingestor_response_port: 5556
flink_market_data_endpoint: "tcp://flink-jobmanager:5557"
request_timeout_secs: 30
high_water_mark: 10000
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONFIG_PATH", raising=False)
    monkeypatch.delenv("RELAY_REALTIME_GRACE_SECS", raising=False)
    for key in list(RelaySettings.model_fields):
        monkeypatch.delenv(f"RELAY_{key.upper()}", raising=False)


def test_spec_config_file_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(SPEC_CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the spec's own keys are not deprecated
        s = load_settings(path)
    assert s.bind_address == "tcp://*"
    assert (s.client_request_port, s.market_data_pub_port) == (5559, 5558)
    assert (s.ingestor_work_port, s.ingestor_response_port) == (5555, 5556)
    assert s.flink_market_data_endpoint == "tcp://flink-jobmanager:5557"
    assert s.request_timeout_s == 30
    assert s.high_water_mark == 10000
    assert s.ingestor_control_port == 5560  # additions keep their defaults
    assert s.endpoint(s.client_request_port) == "tcp://*:5559"


def test_packaged_config_file_equals_the_code_defaults() -> None:
    """services/relay/config.yaml documents the defaults: it must not drift from them."""
    data = yaml.safe_load((HERE.parent / "config.yaml").read_text())
    assert set(data) == set(RelaySettings.model_fields)
    assert RelaySettings(**data) == RelaySettings()


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(SPEC_CONFIG)
    monkeypatch.setenv("RELAY_CLIENT_REQUEST_PORT", "15559")
    monkeypatch.setenv("RELAY_KNOWN_EXCHANGES", "binance, COINBASE")
    s = load_settings(path)
    assert s.client_request_port == 15559
    assert s.market_data_pub_port == 5558
    assert s.known_exchanges == ["BINANCE", "COINBASE"]
    monkeypatch.setenv("RELAY_KNOWN_EXCHANGES", '["KRAKEN"]')
    assert load_settings(path).known_exchanges == ["KRAKEN"]
    monkeypatch.setenv("RELAY_KNOWN_EXCHANGES", "")  # empty: any exchange an ingestor serves
    assert load_settings(path).known_exchanges == []
    assert RelaySettings().known_exchanges == []  # the default is dynamic


def test_missing_default_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "absent.yaml", required=False) == RelaySettings()
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "absent.yaml", required=True)


@pytest.mark.parametrize(
    "text",
    [
        "client_request_prot: 5559\n",  # typo: unknown keys are errors
        "client_request_port: 70000\n",
        "request_timeout_secs: 0\n",
        "known_exchanges: ['bin ance']\n",
        "flink_market_data_endpoint: localhost:5557\n",
        "flink_market_data_endpoint: ''\n",  # no upstream at all
        "upstream_market_data: ['relay-a:5558']\n",
        "upstream_curve_secret_key_file: b.key_secret\n",  # without the parent's key
        # CURVE to every upstream, but the pipeline's PUB is plain ZMTP
        "upstream_curve_secret_key_file: b.key_secret\nupstream_curve_server_key_file: r.key\n",
    ],
)
def test_bad_config_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError):
        load_settings(path)


def test_non_mapping_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        load_settings(path)


def test_old_key_names_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("trigger_kafka_bootstrap: k:9092\nrealtime_refresh_secs: 3\n")
    monkeypatch.setenv("RELAY_REALTIME_GRACE_SECS", "5")
    with pytest.warns(DeprecationWarning, match="kafka.bootstrap_servers"):
        s = load_settings(path)
    assert (s.kafka.bootstrap_servers, s.realtime_refresh_s, s.realtime_grace_s) == ("k:9092", 3, 5)


def test_live_periods_default_to_the_contract_and_accept_a_list_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mdproto import contracts

    assert RelaySettings().live_periods == list(contracts.LIVE_PERIODS)
    monkeypatch.setenv("RELAY_LIVE_PERIODS", "900,60,60")
    assert RelaySettings().live_periods == [60, 900]
    monkeypatch.setenv("RELAY_LIVE_PERIODS", "0")
    with pytest.raises(ValidationError, match="positive"):
        RelaySettings()


def test_parent_relays_as_upstreams(monkeypatch: pytest.MonkeyPatch) -> None:
    """A branch of a relay tree: parent relays' :5558, with or without the pipeline."""
    monkeypatch.setenv("RELAY_UPSTREAM_MARKET_DATA", "tcp://relay-a:5558, tcp://relay-b:5558")
    s = RelaySettings()
    assert s.upstreams == [s.flink_market_data_endpoint, "tcp://relay-a:5558", "tcp://relay-b:5558"]
    monkeypatch.setenv("RELAY_FLINK_MARKET_DATA_ENDPOINT", "")
    assert RelaySettings().upstreams == ["tcp://relay-a:5558", "tcp://relay-b:5558"]
