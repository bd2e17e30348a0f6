"""`python -m pipeline.engine`'s entry point: what it refuses, and its ready file."""

from __future__ import annotations

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
