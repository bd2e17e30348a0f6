"""A partition's state object: what is saved is what is read back, an object read while
a writer replaces it (a torn read, as SeaweedFS serves one) is read again and never
taken for a state, and an object of another format is ignored."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pyarrow import fs

from pipeline.live_state import READS, PartitionState, StateStore, TornState

TOPIC = "market.ticks"


def state() -> PartitionState:
    return PartitionState(
        TOPIC,
        2,
        1234,
        {"BINANCE:BTC/USDT": {"windows": []}},
        [("BINANCE:BTC/USDT", "t1"), ("BINANCE:BTC/USDT", "t2")],
        {"BINANCE:BTC/USDT": {"last_price": 101.5, "series": [], "recent": [], "triggers": {}}},
    )


class Replacing(StateStore):
    """A store whose reads first return `torn` (a writer mid-replace), then the object."""

    def __init__(self, root: Path, torn: list[bytes]) -> None:
        self.pauses: list[float] = []
        super().__init__(fs.LocalFileSystem(), str(root), sleep=self.pauses.append)
        self.torn = torn

    def _read(self, path: str) -> bytes | None:
        if self.torn:
            return self.torn.pop(0)
        return super()._read(path)


def test_a_state_reads_back_as_saved(tmp_path: Path) -> None:
    store = StateStore(fs.LocalFileSystem(), str(tmp_path))
    assert store.load(TOPIC, 2) is None
    size = store.save(state())
    assert size == (tmp_path / TOPIC / "2.json").stat().st_size
    assert store.load(TOPIC, 2) == state()


@pytest.mark.parametrize("cut", [10, 60, -1])
def test_a_torn_object_is_refused(cut: int) -> None:
    data = state().encode()
    with pytest.raises(TornState):
        PartitionState.decode(data[:cut], "test")


def test_a_changed_body_of_the_same_length_is_refused() -> None:
    data = state().encode()
    with pytest.raises(TornState):
        PartitionState.decode(data.replace(b"1234", b"9234"), "test")


def test_a_torn_read_is_read_again(tmp_path: Path) -> None:
    StateStore(fs.LocalFileSystem(), str(tmp_path)).save(state())
    data = state().encode()
    store = Replacing(tmp_path, [data[: len(data) // 2], data[:-3]])
    assert store.load(TOPIC, 2) == state()
    assert len(store.pauses) == 2


def test_an_object_torn_at_every_read_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = state().encode()
    store = Replacing(tmp_path, [data[:-1]] * READS)
    with caplog.at_level(logging.ERROR):
        assert store.load(TOPIC, 2) is None
    assert len(store.pauses) == READS - 1
    assert f"ignored after {READS} reads" in caplog.text


def test_a_format_3_object_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = {"format": 3, "topic": TOPIC, "partition": 2, "offset": 5, "candles": {}, "recent": []}
    path = tmp_path / TOPIC / "2.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING):
        assert StateStore(fs.LocalFileSystem(), str(tmp_path)).load(TOPIC, 2) is None
    assert "format 3 is not ours" in caplog.text


def test_the_body_is_the_json_the_standard_library_writes() -> None:
    """orjson encodes; any JSON reader (a restore by an older engine, a person with
    jq) reads the same document `json.dumps` would have written."""
    s = state()
    s.cep["BINANCE:BTC/USDT"]["fires"] = {3: 1}  # an integer key, as json turns it to "3"
    body = s.encode().partition(b"\n")[2]
    expected = {
        "topic": s.topic,
        "partition": s.partition,
        "offset": s.offset,
        "candles": s.candles,
        "recent": s.recent,
        "cep": s.cep,
    }
    assert body == json.dumps(expected, separators=(",", ":")).encode()
