"""The SDK's live order book: sync decisions (pure), the stream, the stored book, the CLI ladder."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from mdclient import cli
from mdclient.book import BookEvent, BookStream, BookSync
from mdclient.cli.views import book_line, ladder_lines
from mdclient.dispatch import Dispatcher
from mdclient.errors import FeedUnavailable
from mdclient.exit_codes import ExitCode
from mdproto import envelope
from mdproto.book import levels_message
from mdproto.markets import Precision
from mdproto.messages import BookDelta, BookReset, BookSnapshot, FeedStatus

T = "BINANCE:BTC/USDT"
EPOCH = 42


def snap(seq: int, xseq: int = 100, reset: int = BookReset.BOOK_RESET_NONE, **kw: Any) -> Any:
    return BookSnapshot(
        ticker=T,
        bids=levels_message(kw.get("bids", [(100.0, 1.0), (99.0, 2.0)])),
        asks=levels_message(kw.get("asks", [(101.0, 1.0), (102.0, 2.0)])),
        exchange_sequence=xseq,
        reset=reset,  # type: ignore[arg-type]
        reason=kw.get("reason", ""),
        sequence=seq,
        publisher_epoch=kw.get("epoch", EPOCH),
    )


Levels = Sequence[tuple[float, float]]


def delta(
    seq: int, xseq: int, bids: Levels = (), asks: Levels = (), epoch: int = EPOCH
) -> BookDelta:
    return BookDelta(
        ticker=T,
        bids=levels_message(bids),
        asks=levels_message(asks),
        exchange_sequence=xseq,
        exchange_prev_sequence=xseq - 1,
        sequence=seq,
        publisher_epoch=epoch,
    )


def kinds(events: list[BookEvent]) -> list[str]:
    return [e.kind for e in events]


def test_deltas_wait_for_a_snapshot_then_apply_in_order() -> None:
    sync = BookSync(T)
    assert not sync.on_message(delta(5, 101, bids=[(100.0, 3.0)]), 0).applied
    assert not sync.in_sync
    outcome = sync.on_message(snap(6, 101), 0)
    assert outcome.applied and outcome.events == [] and sync.in_sync
    assert sync.on_message(delta(7, 102, bids=[(100.0, 0.0)], asks=[(100.5, 1.0)]), 0).applied
    assert sync.book.best_bid() == (99.0, 2.0)
    assert sync.book.best_ask() == (100.5, 1.0)
    assert sync.dropped_deltas == 1


def test_a_sequence_gap_drops_deltas_until_the_next_snapshot_resyncs() -> None:
    sync = BookSync(T)
    sync.on_message(snap(1, 100), 0)
    gap = sync.on_message(delta(3, 102, bids=[(98.0, 1.0)]), 1_000)  # 2 lost
    assert not gap.applied and not sync.in_sync
    assert gap.events == [BookEvent(T, "gap", "sequence gap", missed=1)]
    assert not sync.on_message(delta(4, 103), 1_100).applied  # still waiting: no new event
    healed = sync.on_message(snap(5, 103, bids=[(97.0, 1.0)]), 1_400)
    assert healed.applied and sync.in_sync
    assert healed.events == [BookEvent(T, "resynced", waited_ms=400)]
    assert sync.book.best_bid() == (97.0, 1.0)
    assert (sync.gaps, sync.dropped_deltas) == (1, 2)


def test_an_exchange_sequence_mismatch_is_a_gap_too() -> None:
    sync = BookSync(T)
    sync.on_message(snap(1, 100), 0)
    outcome = sync.on_message(delta(2, 105), 0)  # platform sequence fine, exchange ids skip
    assert not outcome.applied and not sync.in_sync
    [event] = outcome.events
    assert event.kind == "gap" and "delta after 104, book at 100" in event.reason


def test_duplicates_are_dropped_and_a_restart_needs_a_snapshot() -> None:
    sync = BookSync(T)
    sync.on_message(snap(1, 100), 0)
    sync.on_message(delta(2, 101, bids=[(100.0, 5.0)]), 0)
    assert not sync.on_message(snap(2, 101), 0).applied  # a last value we already have
    assert sync.duplicates == 1
    restarted = sync.on_message(delta(1, 102, epoch=EPOCH + 1), 0)
    assert not restarted.applied
    assert kinds(restarted.events) == ["gap"] and "restarted" in restarted.events[0].reason


def test_a_reset_by_the_feed_is_reported_and_replaces_the_book() -> None:
    sync = BookSync(T)
    sync.on_message(snap(1, 100, reset=BookReset.BOOK_RESET_START), 0)
    outcome = sync.on_message(
        snap(2, 500, reset=BookReset.BOOK_RESET_CHECKSUM, reason="crc 1 != 2", asks=[(110.0, 1.0)]),
        0,
    )
    assert outcome.applied and sync.in_sync
    assert outcome.events == [BookEvent(T, "reset", "CHECKSUM: crc 1 != 2")]
    assert sync.book.best_ask() == (110.0, 1.0)
    assert sync.book.exchange_sequence == 500


def stream(**kw: Any) -> BookStream:
    return BookStream(T, lambda s: None, clock_ms=lambda: 0, **kw)


def test_the_stream_serves_the_book_and_queues_applied_messages() -> None:
    events: list[BookEvent] = []
    s = stream(on_event=events.append, maxsize=2)
    s.deliver(delta(1, 100))  # before the snapshot: not queued
    s.deliver(snap(2, 100, reset=BookReset.BOOK_RESET_START, reason="feed started"))
    s.deliver(delta(3, 101, bids=[(100.5, 1.0)]))
    s.deliver(delta(4, 102, asks=[(101.0, 0.0)]))  # the queue holds 2: the oldest goes
    assert s.in_sync and s.wait_synced(0)
    assert s.depth(1) == ([(100.5, 1.0)], [(102.0, 2.0)])
    assert s.spread() == 1.5
    assert [m.sequence for m in (s.get(0), s.get(0))] == [3, 4]  # type: ignore[union-attr]
    assert s.stats["dropped"] == 1
    assert kinds(events) == ["reset"]
    copy = s.snapshot()
    s.deliver(delta(5, 103, bids=[(100.5, 0.0)]))
    assert copy.best_bid() == (100.5, 1.0)  # a copy does not move with the stream


def test_a_failed_feed_ends_the_stream() -> None:
    s = stream()
    s.deliver(FeedStatus(ticker=T, state=FeedStatus.FAILED, reason="delisted"))
    assert s.get(0.5) is None
    with pytest.raises(FeedUnavailable, match="delisted"):
        next(s)


def test_the_dispatcher_routes_book_messages_on_their_exact_topic() -> None:
    got: list[Any] = []
    dispatcher = Dispatcher()
    dispatcher.add_sink(f"{T}|book", got.append)
    dispatcher.handle(envelope.encode_pub(f"{T}|book", snap(1)))
    dispatcher.handle(envelope.encode_pub(f"{T}|bookish", snap(1)))
    assert [type(m).__name__ for m in got] == ["BookSnapshot"]


def test_the_ladder_puts_asks_above_bids_around_the_spread() -> None:
    lines = ladder_lines([(100.0, 1.5), (99.5, 12.0)], [(100.25, 2.0), (101.0, 0.5)])
    assert lines == [
        "ask     101  0.5",
        "ask  100.25    2",
        "---  spread 0.25",
        "bid     100  1.5",
        "bid    99.5   12",
    ]
    line = book_line(T, [(100.0, 1.5)], [(100.25, 2.0)])
    assert "bid 100 x 1.5  ask 100.25 x 2  spread 0.25  levels 1/1" in line


def test_the_ladder_shows_prices_at_the_tick_size() -> None:
    """Issue 47: `54008`, `54007.7`, `54008.13` in one column, and `:g` printed the bid
    54035.73 as 54035.7 next to a 0.03 spread."""
    at_tick = Precision.of(0.01, 0.0001)
    bids, asks = [(54035.7, 0.5), (54008.0, 1.25)], [(54035.73, 2.0), (54036.13, 0.1)]
    assert ladder_lines(bids, asks, at_tick) == [
        "ask  54036.13  0.1000",
        "ask  54035.73  2.0000",
        "---  spread 0.03",
        "bid  54035.70  0.5000",
        "bid  54008.00  1.2500",
    ]
    line = book_line(T, bids, asks, at_tick)
    assert "bid 54035.70 x 0.5000  ask 54035.73 x 2.0000  spread 0.03" in line


def test_book_cli_usage_errors_exit_2() -> None:
    assert cli.main(["book", "BTCUSDT"]) == ExitCode.USAGE
    assert cli.main(["book", T, "--depth", "0"]) == ExitCode.USAGE


def test_book_cli_prints_a_line_per_update_and_the_gap_on_stderr(
    fake_relay: Any, capsys: Any
) -> None:
    topic = f"{T}|book"
    codes: list[int] = []
    # No catalog (port 9): the prices as they come, whatever runs on this machine.
    args = ["book", T, "--count", "2", "--market-data-endpoint", fake_relay.market_data_endpoint,
            "--request-endpoint", fake_relay.request_endpoint,
            "--catalog-uri", "http://127.0.0.1:9"]  # fmt: skip
    thread = threading.Thread(target=lambda: codes.append(cli.main(args)))
    thread.start()
    fake_relay.wait_for(lambda ev: ("sub", topic) in ev and ("sub", f"{T}|status") in ev)
    assert fake_relay.index_of("sub", f"{T}|status".__eq__) < fake_relay.index_of(
        "sub", topic.__eq__
    )
    fake_relay.publish(topic, snap(1, 100))
    fake_relay.publish(topic, delta(3, 101, bids=[(100.0, 9.0)]))  # one lost: out of sync
    fake_relay.publish(topic, snap(4, 101, bids=[(100.0, 7.0)]))
    thread.join(10)
    assert codes == [ExitCode.OK]
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 2  # each shows the book as it is when printed (maybe out of sync)
    assert "bid 100 x 7  ask 101 x 1  spread 1  levels 1/2" in lines[1]
    assert "book out of sync (1 message(s) lost, sequence gap)" in captured.err
    assert "resynced" in captured.err


class _MarketsReader:
    """`read_markets` of one exchange, or a failed read."""

    def __init__(self, rows: list[dict[str, Any]] | None) -> None:
        self.rows = rows

    def read_markets(self, table_name: str, exchange: str) -> Any:
        import pyarrow as pa

        from mdclient.errors import StorageError

        if self.rows is None:
            raise StorageError("no catalog here", error_code="catalog_unavailable")
        assert exchange == "BINANCE"
        return pa.Table.from_pylist(self.rows)


def test_the_tick_and_lot_size_come_from_market_markets_or_stay_unknown() -> None:
    from mdclient.book import read_precision
    from mdclient.config import ClientSettings

    settings = ClientSettings()
    rows = [
        {"ticker": "BINANCE:ETH/USDT", "price_precision": 0.1, "amount_precision": 0.001},
        {"ticker": T, "price_precision": 0.01, "amount_precision": 0.00001},
    ]
    reader: Any = _MarketsReader(rows)
    assert read_precision(reader, settings, T) == Precision(2, 5)
    assert read_precision(reader, settings, "BINANCE:SOL/USDT") == Precision()  # no row
    failing: Any = _MarketsReader(None)
    assert read_precision(failing, settings, T) == Precision()  # a ladder without it
