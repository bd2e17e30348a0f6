"""The relay's log handler: lines formatted where logged, written in batches by a thread."""

from __future__ import annotations

import io
import logging
import sys
import threading

import pytest

from relay.log_lines import BatchedLines, LineFormatter

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


@pytest.fixture(autouse=True)
def _no_leaked_writer() -> object:
    before = {t.name for t in threading.enumerate()}
    yield None
    after = [t for t in threading.enumerate() if t.name == "log-lines" and t.is_alive()]
    assert not after or "log-lines" in before, "a writer thread outlived its handler"
