"""Log lines formatted where they are logged, written in batches by one thread.

The relay logs one line per forwarded request (the spec's INFO line). A queue
handing each record to a writer thread woke that thread once per record, and
every wake-up costs the event loop a GIL hand-over at its next socket call
(pyzmq releases the GIL in each send and recv). Here the loop only formats and
appends the line; the writer wakes every `interval_s` (or once `batch` lines
wait) and writes them in one call, so the loop still never blocks on the
stream and pays no per-line thread switch. A line reaches the stream at most
`interval_s` late; `close()` writes the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import IO


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
        second, stamp = self._cached
        if int(record.created) != second:
            second = int(record.created)
            stamp = time.strftime(self.default_time_format, self.converter(second))
            self._cached = (second, stamp)
        return f"{stamp},{int(record.msecs):03d}"


class BatchedLines(logging.Handler):
    """A handler that keeps formatted lines for its writer thread (see the module)."""

    def __init__(self, stream: IO[str], *, interval_s: float = 0.1, batch: int = 1000) -> None:
        super().__init__()
        self._stream = stream
        self._interval_s = interval_s
        self._batch = batch
        self._lines: deque[str] = deque()  # appended by any thread, taken by the writer
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
            lines = [take() for _ in range(len(self._lines))]  # later ones: the next turn
            if not lines:
                return
            try:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to write to
                pass
