"""Log lines formatted where they are logged, written in batches by one thread.

The relay logs one line per forwarded request (the spec's INFO line). A queue
handing each record to a writer thread woke that thread once per record, and
every wake-up costs the event loop a GIL hand-over at its next socket call
(pyzmq releases the GIL in each send and recv). Here the loop only formats and
appends the line; the writer wakes every `interval_s` (or once `batch` lines
wait) and writes them in one call, so the loop still never blocks on the
stream and pays no per-line thread switch. A line reaches the stream at most
`interval_s` late; `close()` writes the rest.

`HotLine` goes one step further for the line logged per request: when this
handler is where the line would go, the loop appends the line's time and
arguments and the writer formats it. `logging` would build a `LogRecord` (about
8 us, a third of a bare echo's round trip), walk the logger tree, take the
handler's lock and format on the loop; profiled under 100 clients that was a
quarter of the loop's time (docs/relay-benchmarks.md). `HotLine.each` keeps the
lines of a whole batch of requests as one item, stamped once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import IO, NamedTuple


class LineFormatter(logging.Formatter):
    """`{asctime} {levelname} {name}: {message}`, the relay's one layout, built directly.

    `logging.Formatter` with that format string costs a strftime per line and a
    %-format over the record's __dict__; here the time is formatted once per second
    and the line is one f-string. Exceptions and stacks are appended as usual."""

    _cached: tuple[int, str] = (-1, "")  # (second, its strftime), replaced whole

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = record.getMessage()
        return f"{self.formatTime(record)} {record.levelname} {record.name}: {record.message}"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt:
            return super().formatTime(record, datefmt)
        return self._stamp(record.created)

    def line(self, created: float, levelname: str, name: str, message: str) -> str:
        """The line `format` writes for a record with these fields (no exception)."""
        return f"{self._stamp(created)} {levelname} {name}: {message}"

    def _stamp(self, created: float) -> str:
        second, stamp = self._cached
        if int(created) != second:
            second = int(created)
            stamp = time.strftime(self.default_time_format, self.converter(second))
            self._cached = (second, stamp)
        return f"{stamp},{int((created - second) * 1000):03d}"  # LogRecord.msecs' rule


class _Deferred(NamedTuple):
    """`HotLine` calls, formatted by the writer: one line per tuple of arguments."""

    created: float
    level: int
    name: str
    msg: str
    rows: Sequence[tuple[object, ...]]


class BatchedLines(logging.Handler):
    """A handler that keeps formatted lines for its writer thread (see the module)."""

    def __init__(self, stream: IO[str], *, interval_s: float = 0.1, batch: int = 1000) -> None:
        super().__init__()
        self._stream = stream
        self._interval_s = interval_s
        self._batch = batch
        # Appended by any thread, taken by the writer.
        self._lines: deque[str | _Deferred] = deque()
        self._due = threading.Event()  # set: write now (a full batch, or closing)
        self._closing = False
        self._writing = threading.Lock()  # the writer's turns and flush(): one at a time
        self._writer = threading.Thread(target=self._write_loop, name="log-lines", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
            if len(self._lines) >= self._batch:
                self._due.set()
        except Exception:
            self.handleError(record)

    def defer(self, line: _Deferred) -> None:
        """Keep lines the writer will format (`HotLine`: no record, no lock)."""
        self._lines.append(line)
        if len(self._lines) >= self._batch:
            self._due.set()

    def flush(self) -> None:
        """Write the kept lines now, from the calling thread."""
        self._write()

    def close(self) -> None:
        """Stop the writer once every kept line is written (idempotent)."""
        if not self._closing:
            self._closing = True
            self._due.set()
            self._writer.join()
            self._write()
        super().close()

    def _write_loop(self) -> None:
        while not self._closing:
            self._due.wait(self._interval_s)
            self._due.clear()
            self._write()

    def _write(self) -> None:
        with self._writing:
            take = self._lines.popleft
            kept = [take() for _ in range(len(self._lines))]  # later ones: the next turn
            if not kept:
                return
            lines: list[str] = []
            for t in kept:
                if isinstance(t, str):
                    lines.append(t)
                else:
                    lines.extend(self._format_deferred(t, args) for args in t.rows)
            try:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to write to
                pass

    def _format_deferred(self, line: _Deferred, args: tuple[object, ...]) -> str:
        formatter = self.formatter
        try:
            if isinstance(formatter, LineFormatter):
                message = line.msg % args if args else line.msg
                return formatter.line(
                    line.created, logging.getLevelName(line.level), line.name, message
                )
            record = logging.makeLogRecord(
                {"name": line.name, "msg": line.msg, "args": args, "created": line.created,
                 "msecs": (line.created - int(line.created)) * 1000,
                 "levelno": line.level, "levelname": logging.getLevelName(line.level)}
            )  # fmt: skip
            return self.format(record)
        except Exception as exc:  # a bad format string must not lose the writer
            return f"{line.name}: unformattable log line {line.msg!r} {args!r}: {exc}"


class HotLine:
    """One log line with a fixed format, for a per-request path (see the module).

    When the logger is enabled for `level` and the root's only handler is a
    `BatchedLines` without filters (what the `relay` script configures), a call
    appends the time and arguments and the writer formats them; otherwise it is
    `logger.log(level, msg, *args)`, so pytest's caplog or an embedding program's
    handlers still get an ordinary record. (Of the logger's parents, only the root
    is checked: the relay's own loggers carry no handlers.) The arguments are
    formatted later, on the writer: pass immutable values (ids, names, numbers)."""

    def __init__(self, logger: logging.Logger, level: int, msg: str) -> None:
        self._logger = logger
        self._level = level
        self._msg = msg

    def __call__(self, *args: object) -> None:
        self.each((args,))

    def each(self, rows: Sequence[tuple[object, ...]]) -> None:
        """One line per tuple of arguments, as many calls would write them, kept as one
        item with one time stamp (a batch of requests forwarded in one loop turn)."""
        logger = self._logger
        if not rows or not logger.isEnabledFor(self._level):
            return
        handlers = logging.root.handlers
        sink = handlers[0] if len(handlers) == 1 else None
        if (
            type(sink) is BatchedLines
            and sink.level <= self._level
            and not sink.filters
            and not logger.handlers
            and not logger.filters
        ):
            sink.defer(_Deferred(time.time(), self._level, logger.name, self._msg, rows))
        else:
            for args in rows:
                logger.log(self._level, self._msg, *args)
