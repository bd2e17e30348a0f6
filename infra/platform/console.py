"""The console of `make run`: output that may vanish under it without stopping it.

`make run 2>&1 | tee run.log`, then Ctrl-C: the terminal's SIGINT ends `tee`
too, so the supervisor's next line meets a closed pipe. Python raises
BrokenPipeError there (it ignores SIGPIPE), which used to end the shutdown
halfway and leave Kafka, the catalog, the pipeline's JVM and the rest running.
A `Console` drops what it can no longer write instead: shutting everything
down matters more than saying so.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Console:
    """A text stream that stops writing, silently, once its reader has gone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_under_us = False

    def write(self, text: str) -> int:
        if not self.closed_under_us:
            try:
                return self._stream.write(text)
            except (BrokenPipeError, ValueError, OSError):
                self.closed_under_us = True
        return len(text)

    def flush(self) -> None:
        if not self.closed_under_us:
            try:
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.closed_under_us = True

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def tolerate_closed_streams() -> None:
    """Route this process's stdout and stderr through `Console`s (idempotent)."""
    if not isinstance(sys.stdout, Console):
        sys.stdout = Console(sys.stdout)
    if not isinstance(sys.stderr, Console):
        sys.stderr = Console(sys.stderr)
