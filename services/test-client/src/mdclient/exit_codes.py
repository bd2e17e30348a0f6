"""The `mdclient` exit codes: one table, and the SDK error each code answers.

`TABLE` is the only place a code's meaning is written: `mdclient --help` prints
it (`help_section`) and tests/test_exit_codes.py keeps the README's "Exit codes"
and "Errors" tables equal to it, so a script can rely on what either says.
"""

from __future__ import annotations

import textwrap
from enum import IntEnum

from mdclient import errors


class ExitCode(IntEnum):
    """What a command's exit status tells a script."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    REJECTED = 3
    FAILED = 4
    TIMEOUT = 5
    NOT_FOUND = 6
    UNAVAILABLE = 7
    STORAGE = 8
    PROTOCOL = 9
    PENDING = 10
    INCOMPLETE = 11
    UNKNOWN = 12
    INTERRUPTED = 130


#: (code, meaning) in the words of the README's "Exit codes" table (Markdown).
TABLE: tuple[tuple[ExitCode, str], ...] = (
    (ExitCode.OK, "OK (candles printed/written; `live` ended by `--count`/`--duration`)"),
    (ExitCode.INTERNAL, "internal error (a bug; `-v` for the traceback)"),
    (
        ExitCode.USAGE,
        "usage: bad arguments, time/period/ticker format, config file, output folder",
    ),
    (
        ExitCode.REJECTED,
        "rejected by the relay (`SubmitResponse` REJECTED; `live`: feed REFUSED), reason on stderr",
    ),
    (
        ExitCode.FAILED,
        "failed: ERROR notification / legacy ERROR / `live` feed FAILED, reason on stderr",
    ),
    (ExitCode.TIMEOUT, "timeout: no ack or no notification after every attempt"),
    (
        ExitCode.NOT_FOUND,
        "no data: NOT_FOUND or no rows in the range (CSV/Parquet still written, empty); "
        "`markets`: none for the exchange; `recording`: nothing stored for the exchange; "
        "`trades`: the range is not recorded; `book --at`, `book-samples`: no book stored; "
        "`replay`: a ticker with nothing stored for the channels asked; `export`: no day of "
        "the range has data",
    ),
    (ExitCode.UNAVAILABLE, "relay unreachable within `connect_timeout_s`"),
    (ExitCode.STORAGE, "storage: Iceberg catalog/table/S3 read failed"),
    (ExitCode.PROTOCOL, "protocol mismatch with the relay"),
    (
        ExitCode.PENDING,
        "`status`: PENDING, accepted by a relay, no outcome recorded yet "
        "(`status` exits 0 OK, 6 NOT_FOUND, 4 ERROR)",
    ),
    (
        ExitCode.INCOMPLETE,
        "`history --verify`: the integrity report shows missing candles, or there is none; "
        "`trades --verify`: the report is not `complete`; `book --at`: a stored delta is "
        "missing before the time; `book-samples --verify`: a sample is not exact; "
        "`export --verify`: a day's report is not `complete`",
    ),
    (
        ExitCode.UNKNOWN,
        "`status`: UNKNOWN, no outcome recorded and no relay remembers accepting the id",
    ),
    (ExitCode.INTERRUPTED, "interrupted (Ctrl-C)"),
)

#: Each SDK error's code, every class of mdclient.errors listed (tests/test_exit_codes.py
#: checks): a new error is placed on purpose, not left to inherit its base's code.
ERRORS: dict[type[errors.MdClientError], ExitCode] = {
    errors.ConfigError: ExitCode.USAGE,
    errors.InvalidRequest: ExitCode.USAGE,
    errors.SubmitRejected: ExitCode.REJECTED,
    errors.FeedRefused: ExitCode.REJECTED,
    errors.HistoryFailed: ExitCode.FAILED,
    errors.PipelineUnavailable: ExitCode.FAILED,
    errors.IngestorUnavailable: ExitCode.FAILED,
    errors.FeedUnavailable: ExitCode.FAILED,
    errors.MdTimeout: ExitCode.TIMEOUT,
    errors.RequestTimeout: ExitCode.TIMEOUT,
    errors.HistoryTimeout: ExitCode.TIMEOUT,
    errors.ReplaySeamTimeout: ExitCode.TIMEOUT,
    errors.RelayUnavailable: ExitCode.UNAVAILABLE,
    errors.StorageError: ExitCode.STORAGE,
    errors.NotRecorded: ExitCode.NOT_FOUND,
    errors.UnknownTicker: ExitCode.NOT_FOUND,
    errors.ProtocolMismatch: ExitCode.PROTOCOL,
}


def for_error(exc: BaseException) -> ExitCode:
    """The exit code of an SDK error, or of its nearest listed base (a subclass defined
    elsewhere); INTERNAL for anything else: a bug."""
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    return ExitCode.INTERNAL


def help_section(width: int = 88) -> str:
    """The "Exit codes" section of `mdclient --help`: `TABLE` as plain text."""
    lines = ["Exit codes:"]
    for code, meaning in TABLE:
        lines += textwrap.wrap(
            meaning.replace("`", ""),
            width=width,
            initial_indent=f"  {code:>3}  ",
            subsequent_indent=" " * 7,
        )
    return "\n".join(lines)
