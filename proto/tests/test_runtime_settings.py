"""The shared settings loader: precedence, renamed keys, picklability."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict
from pydantic_settings import SettingsConfigDict

from mdproto.runtime.settings import FileSettings, load_settings


class _Kafka(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bootstrap_servers: str = "default:9092"
    topic_ticks: str = "ticks"


class Demo(FileSettings):
    model_config = SettingsConfigDict(
        env_prefix="DEMO_", env_nested_delimiter="__", extra="forbid", frozen=True
    )
    renamed = {"kafka.bootstrap": "kafka.bootstrap_servers", "grace_secs": "grace_s"}
    aliases = {"timeout_secs": "timeout_s"}

    kafka: _Kafka = _Kafka()
    grace_s: float = 1.0
    timeout_s: float = 30.0


def test_overrides_beat_environment_beat_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kafka: {bootstrap_servers: 'file:1', topic_ticks: t.file}\ngrace_s: 2\n")
    monkeypatch.setenv("DEMO_KAFKA__BOOTSTRAP_SERVERS", "env:2")
    s = load_settings(Demo, path)
    assert (s.kafka.bootstrap_servers, s.kafka.topic_ticks, s.grace_s) == ("env:2", "t.file", 2)
    assert load_settings(Demo, path, grace_s=3).grace_s == 3
    assert pickle.loads(pickle.dumps(s)) == s


def test_old_names_are_read_as_the_new_ones_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kafka: {bootstrap: 'file:1'}\ngrace_secs: 2\n")
    with pytest.warns(DeprecationWarning, match="use kafka.bootstrap_servers"):
        s = load_settings(Demo, path)
    assert (s.kafka.bootstrap_servers, s.grace_s) == ("file:1", 2)
    monkeypatch.setenv("DEMO_KAFKA__BOOTSTRAP", "env:old")
    monkeypatch.setenv("DEMO_GRACE_SECS", "4")
    with pytest.warns(DeprecationWarning, match="DEMO_GRACE_S"):
        s = load_settings(Demo, path)
    assert (s.kafka.bootstrap_servers, s.grace_s) == ("env:old", 4)
    monkeypatch.setenv("DEMO_KAFKA__BOOTSTRAP_SERVERS", "env:new")  # the new name wins
    with pytest.warns(DeprecationWarning):
        assert load_settings(Demo, grace_secs=5).kafka.bootstrap_servers == "env:new"


def test_a_specs_own_names_are_read_without_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("timeout_secs: 7\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        assert load_settings(Demo, path).timeout_s == 7
        monkeypatch.setenv("DEMO_TIMEOUT_SECS", "8")
        assert load_settings(Demo, path).timeout_s == 8
        assert load_settings(Demo, timeout_secs=9).timeout_s == 9
        monkeypatch.setenv("DEMO_TIMEOUT_S", "10")  # our own name wins over the alias
        assert load_settings(Demo, path).timeout_s == 10


def test_missing_or_malformed_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(Demo, tmp_path / "absent.yaml")
    assert load_settings(Demo, tmp_path / "absent.yaml", required=False) == Demo()
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ValueError, match="mapping"):
        load_settings(Demo, tmp_path / "list.yaml")
