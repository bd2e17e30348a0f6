"""The relay's log handler: lines formatted where logged, written in batches by a thread."""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from relay.log_lines import BatchedLines, HotLine, LineFormatter

LAYOUT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Stream(io.StringIO):
    """A stream that says when it was written to, and from which thread."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()
        self.writers: set[str] = set()

    def write(self, text: str) -> int:
        self.writers.add(threading.current_thread().name)
        n = super().write(text)
        self.written.set()
        return n


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = sys.exc_info() if exc else None
    return logging.getLogger("relay.test").makeRecord(
        "relay.test", logging.INFO, __file__, 1, msg, args, info
    )


def test_the_line_is_the_one_logging_formatter_writes() -> None:
    record = _record("Forwarded request to ingestors: prefix=%s, request_id=%s", "X:", "r1")
    assert LineFormatter().format(record) == logging.Formatter(LAYOUT).format(record)
    later = _record("plain")
    later.created += 3600  # another second than the one cached
    assert LineFormatter().format(later) == logging.Formatter(LAYOUT).format(later)


def test_a_traceback_is_appended_as_logging_formatter_does() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed %s", "x", exc=True)
    line = LineFormatter().format(record)
    record.exc_text = None  # formatted again from exc_info
    assert line == logging.Formatter(LAYOUT).format(record)
    assert line.endswith("ValueError: boom")


def _handler(stream: Stream, **kwargs: float) -> BatchedLines:
    handler = BatchedLines(stream, **kwargs)  # type: ignore[arg-type]
    handler.setFormatter(LineFormatter())
    return handler


def test_lines_are_written_by_the_writer_thread_in_order() -> None:
    stream = Stream()
    handler = _handler(stream, interval_s=0.05)
    try:
        for i in range(3):
            handler.handle(_record("line %d", i))
        assert stream.written.wait(10), "the writer never wrote"
    finally:
        handler.close()
    assert [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()] == [
        "line 0",
        "line 1",
        "line 2",
    ]
    assert stream.writers == {"log-lines"}  # not the thread that logged


def test_a_full_batch_is_written_before_the_interval_ends() -> None:
    stream = Stream()
    handler = _handler(stream, interval_s=3600, batch=2)
    try:
        handler.handle(_record("one"))
        handler.handle(_record("two"))
        assert stream.written.wait(10), "a full batch waited for the interval"
    finally:
        handler.close()
    assert len(stream.getvalue().splitlines()) == 2


def test_close_writes_every_kept_line_and_flush_writes_now() -> None:
    stream = Stream()
    handler = _handler(stream, interval_s=3600)
    handler.handle(_record("first"))
    handler.flush()
    assert stream.getvalue().endswith("first\n")
    handler.handle(_record("last"))
    handler.close()
    assert stream.getvalue().endswith("last\n")
    handler.close()  # again: nothing happens


def test_a_broken_stream_does_not_reach_the_logging_code() -> None:
    class Broken(Stream):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    handler = _handler(Broken(), interval_s=3600)
    handler.handle(_record("lost"))
    handler.close()  # no exception


FORWARDED = "Forwarded request to ingestors: prefix=%s, request_id=%s, kind=%s"


@pytest.fixture
def only_handler() -> Iterator[Callable[[logging.Handler], None]]:
    """Makes a handler the root's only one (as the relay script does), pytest's back after."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level

    def install(handler: logging.Handler) -> None:
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)

    yield install
    root.handlers[:] = saved
    root.setLevel(level)


Sink = Callable[[], tuple[Stream, BatchedLines]]


@pytest.fixture
def hot_sink(only_handler: Callable[[logging.Handler], None]) -> Sink:
    """Installs the relay script's handler (the hot path's sink), writing only when closed.
    Called by the test itself: pytest puts its own handlers on the root for each phase."""

    def install() -> tuple[Stream, BatchedLines]:
        stream = Stream()
        handler = _handler(stream, interval_s=3600)
        only_handler(handler)
        return stream, handler

    return install


def test_a_hot_line_is_the_line_logging_would_write(
    hot_sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, handler = hot_sink()
    logger = logging.getLogger("relay.hot")
    made: list[object] = []

    def make_record(*args: object, **kwargs: object) -> None:
        made.append(args)

    monkeypatch.setattr(logger, "makeRecord", make_record)
    HotLine(logger, logging.INFO, FORWARDED)("BINANCE:", "r1", "historical")
    assert not made, "the hot path built a LogRecord"
    handler.close()
    line = stream.getvalue().rstrip("\n")
    stamp = line.split(" INFO ", 1)[0]
    record = logging.makeLogRecord(
        {"name": "relay.hot", "msg": FORWARDED, "args": ("BINANCE:", "r1", "historical"),
         "levelname": "INFO", "levelno": logging.INFO}
    )  # fmt: skip
    expected = logging.Formatter(LAYOUT).format(record)
    assert line.split(" ", 2)[2] == expected.split(" ", 2)[2]
    assert line.endswith("prefix=BINANCE:, request_id=r1, kind=historical")
    assert len(stamp) == len("2026-11-28 07:00:00,123")


def test_a_batch_of_hot_lines_is_the_lines_single_calls_write(hot_sink: Sink) -> None:
    stream, handler = hot_sink()
    hot = HotLine(logging.getLogger("relay.hot"), logging.INFO, FORWARDED)
    hot.each([("BINANCE:", "r1", "historical"), ("KRAKEN:", "r2", "historical")])
    hot("BINANCE:", "r3", "legacy")
    hot.each([])
    handler.close()
    assert [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()] == [
        "Forwarded request to ingestors: prefix=BINANCE:, request_id=r1, kind=historical",
        "Forwarded request to ingestors: prefix=KRAKEN:, request_id=r2, kind=historical",
        "Forwarded request to ingestors: prefix=BINANCE:, request_id=r3, kind=legacy",
    ]


def test_a_batch_of_hot_lines_is_records_elsewhere(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("relay.hot")
    with caplog.at_level(logging.INFO, logger="relay.hot"):
        HotLine(logger, logging.INFO, FORWARDED).each(
            [("X:", "r1", "legacy"), ("Y:", "r2", "legacy")]
        )
    assert [r.args for r in caplog.records] == [("X:", "r1", "legacy"), ("Y:", "r2", "legacy")]


def test_a_hot_line_is_an_ordinary_record_elsewhere(caplog: pytest.LogCaptureFixture) -> None:
    """With pytest's handlers (or an embedding program's) on the root, logging gets it."""
    logger = logging.getLogger("relay.hot")
    with caplog.at_level(logging.INFO, logger="relay.hot"):
        HotLine(logger, logging.INFO, FORWARDED)("BINANCE:", "r2", "legacy")
    assert [r.getMessage() for r in caplog.records] == [
        "Forwarded request to ingestors: prefix=BINANCE:, request_id=r2, kind=legacy"
    ]


def test_a_hot_line_below_the_level_is_dropped(hot_sink: Sink) -> None:
    stream, handler = hot_sink()
    logging.getLogger().setLevel(logging.WARNING)
    HotLine(logging.getLogger("relay.hot"), logging.INFO, FORWARDED)("X:", "r3", "legacy")
    handler.close()
    assert stream.getvalue() == ""


def test_a_hot_line_that_does_not_format_is_written_as_such(
    hot_sink: Sink,
) -> None:
    stream, handler = hot_sink()
    hot = HotLine(logging.getLogger("relay.hot"), logging.INFO, FORWARDED)
    hot("only one argument")
    hot("X:", "r4", "historical")  # the writer goes on
    handler.close()
    first, second = stream.getvalue().splitlines()
    assert "unformattable log line" in first
    assert second.endswith("request_id=r4, kind=historical")


def test_a_hot_line_through_another_formatter_gets_a_record(
    only_handler: Callable[[logging.Handler], None],
) -> None:
    stream = Stream()
    handler = BatchedLines(stream, interval_s=3600)
    handler.setFormatter(logging.Formatter("%(levelname)s|%(name)s|%(message)s"))
    only_handler(handler)
    HotLine(logging.getLogger("relay.hot"), logging.INFO, FORWARDED)("X:", "r5", "legacy")
    handler.close()
    assert stream.getvalue() == (
        "INFO|relay.hot|Forwarded request to ingestors: prefix=X:, request_id=r5, kind=legacy\n"
    )


@pytest.fixture(autouse=True)
def _no_leaked_writer() -> object:
    before = {t.name for t in threading.enumerate()}
    yield None
    after = [t for t in threading.enumerate() if t.name == "log-lines" and t.is_alive()]
    assert not after or "log-lines" in before, "a writer thread outlived its handler"
