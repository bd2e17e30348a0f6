"""Config: defaults, YAML file, env overrides, validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.config import Settings, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("PIPELINE_") or name == "CONFIG_PATH":
            monkeypatch.delenv(name)


def test_defaults_follow_the_contracts() -> None:
    s = load_settings()
    assert s.kafka.topic_ohlc_batches == "market.ohlc.batches"
    assert s.kafka.topic_ticks == "market.ticks"
    assert s.kafka.topic_live_candles == "market.ohlc.live"
    assert s.pub_endpoint == "tcp://*:5557"
    assert s.catalog.namespace == "market"
    assert s.live.periods == [60, 300, 3600]
    assert s.table("ohlc") == "lake.market.ohlc"
    assert s.enabled_queries == [
        "history",
        "ticks-persist",
        "candles-store",
        "book-store",
        "markets",
        "gaps",
    ]
    assert s.kafka.topic_book == "market.book"
    assert (s.live.book_snapshot_s, s.catalog.book_snapshots_table) == (1.0, "book_snapshots")
    assert s.kafka.topic_cep_triggers == "cep.triggers"
    assert s.kafka.topic_markets == "market.markets"
    assert s.markets.trigger_s == 5.0  # idle triggers cost offsets only; markets soon stored
    assert (s.kafka.topic_recording, s.catalog.gaps_table) == ("market.recording", "gaps")
    g = s.gaps
    assert (g.trigger_s, g.retry_s, g.ticks_wait_s, g.settle_s, g.correction_s) == (
        5.0,
        10.0,
        900.0,
        300.0,
        300.0,
    )


def test_yaml_then_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "kafka:\n  bootstrap: k1:9092\ncheckpoint_dir: s3a://b/ck/\n"
        "live:\n  periods: [300, 60]\n  watermark_s: 5\n"
    )
    monkeypatch.setenv("CONFIG_PATH", str(path))
    monkeypatch.setenv("PIPELINE_KAFKA__BOOTSTRAP_SERVERS", "k2:9092")
    monkeypatch.setenv("PIPELINE_HISTORY__TRIGGER_S", "0.25")

    s = load_settings()

    assert s.kafka.bootstrap_servers == "k2:9092"  # env beats the file
    assert s.history.trigger_s == 0.25
    assert s.live.periods == [60, 300]  # sorted
    assert s.live.watermark_s == 5
    assert s.checkpoint_for("history") == "s3a://b/ck/history"


def test_restart_policy_defaults_and_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    r = load_settings().restart
    assert (r.max_restarts, r.window_s, r.backoff_initial_s, r.backoff_max_s) == (5, 300, 1, 60)
    monkeypatch.setenv("PIPELINE_RESTART__MAX_RESTARTS", "2")
    monkeypatch.setenv("PIPELINE_RESTART__BACKOFF_INITIAL_S", "0.5")
    r = load_settings().restart
    assert (r.max_restarts, r.backoff_initial_s) == (2, 0.5)


def test_a_named_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="pipeline config file not found"):
        load_settings(tmp_path / "missing.yaml")


@pytest.mark.parametrize("periods", [[], [0, 60], [60, 60]])
def test_bad_periods_are_rejected(periods: list[int]) -> None:
    with pytest.raises(ValidationError, match="periods"):
        Settings.model_validate({"live": {"periods": periods}})


def test_unknown_keys_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kafka:\n  bootstrapp: typo:9092\n")
    with pytest.raises(ValidationError, match="bootstrapp"):
        load_settings(path)


def test_disabled_paths_drop_their_queries() -> None:
    s = Settings.model_validate(
        {
            "live": {"enabled": False},
            "cep": {"enabled": False},
            "markets": {"enabled": False},
            "gaps": {"enabled": False},
        }
    )
    assert s.enabled_queries == ["history"]
    s = Settings.model_validate({"live": {"enabled": False}})
    assert s.enabled_queries == ["history", "markets", "gaps"]  # CEP is the live engine's


def test_settings_from_a_file_can_be_pickled(tmp_path: Path) -> None:
    """The PUB server process receives the settings by pickle."""
    import pickle

    path = tmp_path / "c.yaml"
    path.write_text("kafka:\n  bootstrap: k1:9092\n")
    s = load_settings(path)
    assert type(s) is Settings
    assert pickle.loads(pickle.dumps(s)) == s
    assert s.kafka.bootstrap_servers == "k1:9092"


def test_retired_live_keys_are_ignored_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A config from before the live engine (or before ADR 0017's write rule) still starts
    the pipeline."""
    path = tmp_path / "old.yaml"
    path.write_text(
        "live:\n  close_mode: event\n  candle_close_trigger_s: 0.5\n"
        "catalog:\n  driver_appends: false\n"
    )
    monkeypatch.setenv("PIPELINE_LIVE__PUBLISHER", "kafka")
    with pytest.warns(DeprecationWarning):
        s = load_settings(path)
    assert s.live.store_trigger_s == 2.0
    retired = [r.message for r in caplog.records if "no longer used" in r.message]
    assert len(retired) == 4, retired
    assert any("driver_append_max_rows" in m for m in retired), retired


def test_the_write_rule_threshold_is_set_by_env_and_never_negative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PIPELINE_CATALOG__DRIVER_APPEND_MAX_ROWS", "0")  # all Spark appends
    assert load_settings(None).catalog.driver_append_max_rows == 0
    with pytest.raises(ValidationError):
        Settings.model_validate({"catalog": {"driver_append_max_rows": -1}})
    monkeypatch.setenv("PIPELINE_CATALOG__EXECUTOR_APPEND_MIN_RECORDS", "0")  # never
    assert load_settings(None).catalog.executor_append_min_records == 0
    with pytest.raises(ValidationError):
        Settings.model_validate({"catalog": {"executor_append_min_records": -1}})


def test_driver_appends_reach_the_catalog_and_store_spark_writes_to() -> None:
    from pipeline.config import CatalogConfig

    c = CatalogConfig(uri="http://cat:8181", s3_endpoint="http://s3:9000", s3_access_key="k")
    assert c.pyiceberg_properties() == {
        "type": "rest",
        "uri": "http://cat:8181",
        "warehouse": "s3://warehouse/lake",
        "s3.endpoint": "http://s3:9000",
        "s3.path-style-access": "true",
        "s3.region": "us-east-1",
        "s3.access-key-id": "k",
        "s3.secret-access-key": "localstack-secret",
    }
