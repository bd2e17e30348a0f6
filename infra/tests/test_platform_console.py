"""`make run 2>&1 | tee run.log`, Ctrl-C: tee dies first, the shutdown must still finish."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import pytest

from infra.platform import __main__ as cli
from infra.platform.console import Console


def _closed_pipe_writer() -> Any:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the reader (tee) is gone
    return os.fdopen(write_fd, "w", buffering=1)


def test_a_console_whose_reader_is_gone_drops_output_instead_of_raising() -> None:
    raw = _closed_pipe_writer()
    with pytest.raises(BrokenPipeError):  # what print() met before
        raw.write("x\n")
        raw.flush()
    console = Console(_closed_pipe_writer())
    assert console.write("stopping ...\n") == len("stopping ...\n")
    console.flush()
    print("more", file=console, flush=True)
    assert console.closed_under_us


class _Platform:
    """Stops "components" one by one, saying so, as `Platform.down` does."""

    COMPONENTS = ("ingestor", "relay", "spark-pipeline", "kafka", "catalog", "seaweedfs")

    def __init__(self) -> None:
        self.config = argparse.Namespace(data_dir=None, prefixes=["BINANCE"])
        self.endpoints = None
        self.stopped: list[str] = []

    def up(self) -> None:
        return None

    def down(self) -> None:
        for name in self.COMPONENTS:
            print(f"[platform] {name}: stopped", file=sys.stderr, flush=True)
            self.stopped.append(name)


def test_ctrl_c_with_stderr_closed_still_stops_every_component(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = _Platform()
    monkeypatch.setattr(sys, "stderr", Console(_closed_pipe_writer()))
    monkeypatch.setattr(sys, "stdout", Console(_closed_pipe_writer()))
    monkeypatch.setattr(cli, "history_demo", lambda *a: 0)

    def ctrl_c(_platform: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_wait_for_ctrl_c", ctrl_c)
    args = argparse.Namespace(ticker="BINANCE:BTC/USDT", period="1m", start="-1h", once=False)

    assert cli._run(platform, args) == 130  # type: ignore[arg-type]
    assert platform.stopped == list(_Platform.COMPONENTS)
