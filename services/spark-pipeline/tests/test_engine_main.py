"""`python -m pipeline.engine`'s entry point: what it refuses, and its ready file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline import engine


def test_without_relay_endpoints_it_refuses_and_leaves_no_stale_ready_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2 on a config that cannot run an extra engine; a ready file left by an
    earlier run in the same container is gone first, so the healthcheck cannot
    pass on it (compose's `live-engine` restarts in place)."""
    config = tmp_path / "config.yaml"
    config.write_text("live:\n  relay_engine_endpoints: []\n")
    ready = tmp_path / "engine.ready"
    ready.write_text("1234")
    monkeypatch.delenv("PIPELINE_LIVE__RELAY_ENGINE_ENDPOINTS", raising=False)
    assert engine.main(["--config", str(config), "--ready-file", str(ready)]) == 2
    assert not ready.exists()


def test_an_extra_engine_refuses_a_checkpoint_dir_other_engines_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An extra engine's own snapshot is its process's: with engines of one config on
    one S3 prefix each would overwrite the others' trigger set and offsets."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "checkpoint_dir: s3a://warehouse/checkpoints\n"
        "live:\n  relay_engine_endpoints: [tcp://127.0.0.1:1]\n"
    )
    for name in ("PIPELINE_LIVE__RELAY_ENGINE_ENDPOINTS", "PIPELINE_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(engine.EngineConfigError, match="not local"):
        engine.serve(engine.load_settings(str(config)), threading.Event())
