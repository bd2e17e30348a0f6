"""`mdclient` command line: history, status, live, order books, legacy, CEP triggers,
market metadata, what the platform records and its stored trades (trades_cli).

Flow of `mdclient history`:

    parse args -> settings (YAML < env < flags) -> check output paths
      -> Client (connect, per-client subscribe) -> history (spinner on stderr)
      -> table on stdout / CSV / Parquet / chart PNG -> exit code

Rendering (the last section: candle, market and recording tables, CSV, Parquet,
live lines, the integrity line) is the CLI's alone; the SDK never imports rich.

Exit codes (README "Exit codes"): see EXIT_* below.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from rich import box
from rich.table import Table

from mdclient import errors, extras, timeparse
from mdclient.chart import FEATURE as CHART_FEATURE
from mdclient.config import ClientSettings, load_settings
from mdproto import topics
from mdproto.markets import Precision, price_difference
from mdproto.messages import OHLC, HistoryReadyNotification, HistorySource, TakerSide
from mdproto.tables import Markets, Ohlc

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console

    from mdclient.book import BookStream
    from mdclient.client import Client
    from mdclient.history import HistoryResult, ProgressEvent
    from mdclient.live import LiveMessage
    from mdclient.recording import LostGap, RecordingStatus
    from mdclient.streams import QueueStream
    from mdproto.book import Level
    from mdproto.messages import FeedStatus

T = TypeVar("T")
#: Prices and amounts without market metadata: each in its shortest exact form.
_AS_THEY_COME = Precision()
EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: unexpected exception (traceback with -v)
EXIT_USAGE = 2  # bad arguments, time/period/ticker format, config, output path
EXIT_REJECTED = 3  # the relay refused the request (SubmitResponse REJECTED, live REFUSED)
EXIT_FAILED = 4  # ERROR notification / legacy ERROR / live FAILED: the platform gave up
EXIT_TIMEOUT = 5  # no ack or no notification in time, after every attempt
EXIT_NOT_FOUND = 6  # no candles in the range (NOT_FOUND or 0 rows); `trades`: not recorded
EXIT_UNAVAILABLE = 7  # relay not reachable within connect_timeout_s
EXIT_STORAGE = 8  # Iceberg catalog / S3 read failed
EXIT_PROTOCOL = 9  # the relay spoke something this client does not understand
EXIT_PENDING = 10  # `status`: accepted, no outcome recorded for the request yet
EXIT_INCOMPLETE = 11  # `history --verify`: candles are missing (or the report is unknown)
EXIT_UNKNOWN = 12  # `status`: no outcome, and no relay remembers accepting the request
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (errors.ConfigError, EXIT_USAGE),
    (errors.InvalidRequest, EXIT_USAGE),
    (errors.SubmitRejected, EXIT_REJECTED),
    (errors.FeedRefused, EXIT_REJECTED),
    (errors.HistoryFailed, EXIT_FAILED),
    (errors.FeedUnavailable, EXIT_FAILED),
    (errors.MdTimeout, EXIT_TIMEOUT),
    (errors.RelayUnavailable, EXIT_UNAVAILABLE),
    (errors.StorageError, EXIT_STORAGE),
    (errors.NotRecorded, EXIT_NOT_FOUND),
    (errors.ProtocolMismatch, EXIT_PROTOCOL),
)

log = logging.getLogger("mdclient")


class UsageError(Exception):
    """Bad command-line input discovered after argparse (exit 2)."""


def common_options(*, in_command: bool) -> argparse.ArgumentParser:
    """The connection and output options every command takes, before or after it.

    The top-level parser holds them with their defaults; each command's copy
    (`in_command`) sets nothing unless given, so `mdclient --config F history ...`
    is not undone by the command's own default (argparse's subparser defaults
    would overwrite the value parsed before the command).
    """
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if in_command else {}
    common = argparse.ArgumentParser(add_help=False)
    conn = common.add_argument_group("connection (override config file and MDCLIENT_* env)")
    conn.add_argument(
        "--config", type=Path, help="YAML config file (default: $CONFIG_PATH)", **unset
    )
    conn.add_argument(
        "--relay-host", help="relay host (ports 5559/5558 unless overridden)", **unset
    )
    conn.add_argument("--request-endpoint", help="e.g. tcp://host:5559", **unset)
    conn.add_argument("--market-data-endpoint", help="e.g. tcp://host:5558", **unset)
    conn.add_argument("--client-id", help="client id (default: random per run)", **unset)
    conn.add_argument("--catalog-uri", help="Iceberg REST catalog URI", **unset)
    conn.add_argument("--warehouse", help="Iceberg warehouse", **unset)
    conn.add_argument("--s3-endpoint", help="S3 endpoint URL", **unset)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr", **unset)
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging", **unset)
    return common


def build_parser() -> argparse.ArgumentParser:
    common = common_options(in_command=True)

    range_args = argparse.ArgumentParser(add_help=False)
    range_args.add_argument("ticker", help="EXCHANGE:BASE/QUOTE, e.g. BINANCE:BTC/USDT")
    range_args.add_argument("--period", default="1m", help="60, 1m, 5m, 1h, 1d (default 1m)")
    range_args.add_argument(
        "--start", default="-24h", help="now, -24h, 2026-11-20, 2026-11-20T10:00, epoch ms"
    )
    range_args.add_argument("--end", default="now", help="same formats; range is [start, end)")
    range_args.add_argument("--timeout", type=float, help="seconds to wait per attempt")
    range_args.add_argument("--attempts", type=int, help="attempts, each with a new request_id")
    out = range_args.add_argument_group("output")
    out.add_argument("--rows", type=int, default=20, help="table rows: head+tail (0 = all)")
    out.add_argument("--no-table", action="store_true", help="print no table")
    out.add_argument("--csv", type=Path, metavar="FILE", help="write the candles as CSV")
    out.add_argument("--parquet", type=Path, metavar="FILE", help="write the candles as Parquet")
    out.add_argument("--chart", type=Path, metavar="PNG", help="candlestick + volume chart")

    parser = argparse.ArgumentParser(
        prog="mdclient",
        parents=[common_options(in_command=False)],
        description="History, live and legacy client of the market-data platform.",
        epilog="Exit codes: 0 ok, 2 usage, 3 rejected, 4 failed, 5 timeout, 6 no data or "
        "not recorded, "
        "7 relay unreachable, 8 storage, 9 protocol, 10 pending (status), "
        "11 incomplete (--verify), 12 unknown (status), 130 Ctrl-C.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    history = sub.add_parser(
        "history",
        parents=[common, range_args],
        help="request history, wait for the notification, read Iceberg",
    )
    history.add_argument(
        "--notify",
        choices=["per_client", "per_request"],
        help="notification pattern: RESPONSE:{client_id} or HISTORY_READY:{request_id}",
    )
    history.add_argument(
        "--no-pin", action="store_true", help="read the current snapshot, not the notified one"
    )
    history.add_argument(
        "--refetch",
        action="store_true",
        help="fetch the whole range from the exchange even where it is stored",
    )
    history.add_argument(
        "--verify",
        action="store_true",
        help="exit 11 unless the integrity report shows no missing candles",
    )

    legacy = sub.add_parser(
        "legacy", parents=[common, range_args], help="deprecated synchronous OHLCRequest"
    )
    legacy.add_argument("--limit", type=int, default=0, help="max candles (0 = no limit)")

    live = sub.add_parser("live", parents=[common], help="stream ticks and/or candles")
    live.add_argument("ticker", help="EXCHANGE:BASE/QUOTE")
    live.add_argument("--ticks", action="store_true", help="stream trades (default if no --ohlc)")
    live.add_argument(
        "--ohlc", action="append", default=[], metavar="PERIOD", help="stream candles (repeatable)"
    )
    live.add_argument("--count", type=int, help="stop after N messages (exit 0)")
    live.add_argument("--duration", type=float, help="stop after N seconds (exit 0)")

    book = sub.add_parser(
        "book",
        parents=[common],
        help="a live L2 order book ladder (or a stored one with --at)",
        description="On a terminal the ladder is redrawn in place; otherwise one line per "
        "update. Resets and resyncs of the book go to stderr.",
    )
    book.add_argument("ticker", help="EXCHANGE:BASE/QUOTE")
    book.add_argument("--depth", type=int, default=10, help="levels per side shown (default 10)")
    book.add_argument("--count", type=int, help="stop after N updates (exit 0)")
    book.add_argument("--duration", type=float, help="stop after N seconds (exit 0)")
    book.add_argument(
        "--once", action="store_true", help="print the ladder once the book is whole, then exit"
    )
    book.add_argument(
        "--at", metavar="TIME", help="the stored book at TIME (Iceberg; no relay needed)"
    )

    status = sub.add_parser(
        "status",
        parents=[common],
        help="a history request's outcome from the requests table (needs no relay)",
    )
    status.add_argument("request_id", help="the request_id the submit was acknowledged with")
    markets = sub.add_parser(
        "markets", parents=[common], help="an exchange's markets (Iceberg market.markets)"
    )
    markets.add_argument("exchange", help="e.g. BINANCE")
    markets.add_argument("--active", action="store_true", help="only markets that trade")
    recording = sub.add_parser(
        "recording",
        parents=[common],
        help="what the platform records: per market its stored trades and gaps (Iceberg)",
        description="Per ticker with trades in market.ticks or gaps in market.gaps: the "
        "oldest and newest stored trade, trades of the current UTC day, and gaps open, "
        "repairing, repaired and unrepairable (each unrepairable one with its reason).",
    )
    recording.add_argument("exchange", nargs="?", help="e.g. BINANCE (default: every exchange)")
    recording.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table (default), or csv / json on stdout for scripts",
    )

    from mdclient import trigger_cli

    trigger_cli.add_parser(sub, common)
    from mdclient import trades_cli

    trades_cli.add_parser(sub, common)
    return parser


def join_relative_times(argv: Sequence[str]) -> list[str]:
    """`--start -24h` -> `--start=-24h`: argparse would take `-24h` for an option."""
    out: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in ("--start", "--end") and following[:1] == "-" and following[1:2].isdigit():
            out.append(f"{token}={following}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def settings_from_args(args: argparse.Namespace) -> ClientSettings:
    overrides: dict[str, Any] = {
        "relay_host": args.relay_host,
        "request_endpoint": args.request_endpoint,
        "market_data_endpoint": args.market_data_endpoint,
        "client_id": args.client_id,
        "catalog_uri": args.catalog_uri,
        "warehouse": args.warehouse,
        "s3_endpoint": args.s3_endpoint,
    }
    if getattr(args, "notify", None):
        overrides["notify"] = args.notify
    return load_settings(args.config, **overrides)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(join_relative_times(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: --help is 0, bad usage is 2
        return int(exc.code or 0)
    _setup_logging(args.verbose)
    from rich.console import Console
    from rich.markup import escape  # server reasons and codes ("[no_ingestor]") are not markup

    err = Console(stderr=True, quiet=False)
    try:
        command: Callable[[argparse.Namespace, Console], int] = COMMANDS[args.command]
        return command(args, err)
    except KeyboardInterrupt:
        err.print("interrupted")
        return EXIT_INTERRUPTED
    except UsageError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return EXIT_USAGE
    except errors.MdClientError as exc:
        err.print(f"[red]{type(exc).__name__}:[/] {escape(str(exc))}", highlight=False)
        return exit_code_for(exc)
    except Exception as exc:
        log.debug("unexpected error", exc_info=True)
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} (run with -v)")
        return EXIT_INTERNAL


def exit_code_for(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_INTERNAL


def run() -> None:
    sys.exit(main())


# --- commands ---


def cmd_history(args: argparse.Namespace, err: Console) -> int:
    return _fetch(args, err, legacy=False)


def cmd_legacy(args: argparse.Namespace, err: Console) -> int:
    return _fetch(args, err, legacy=True)


def _fetch(args: argparse.Namespace, err: Console, *, legacy: bool) -> int:
    ticker, period, start_ms, end_ms = parse_range_args(args)
    for path in (args.csv, args.parquet, args.chart):
        if path is not None:
            try:
                check_writable(path)
            except OSError as exc:
                raise UsageError(str(exc)) from None
    if args.chart and not extras.installed("chart"):  # before asking the platform anything
        raise UsageError(extras.missing_message("chart", CHART_FEATURE))
    settings = settings_from_args(args)
    what = describe(ticker, period, start_ms, end_ms)
    with _client(settings) as client, _Progress(err, what, quiet=args.quiet) as progress:
        if legacy:
            progress.note("legacy request (synchronous)")
            result = client.fetch_ohlc_sync(
                ticker, period, start_ms, end_ms,
                limit=args.limit, timeout_s=args.timeout, attempts=args.attempts,
            )  # fmt: skip
        else:
            result = client.history(
                ticker, period, start_ms, end_ms,
                timeout_s=args.timeout, attempts=args.attempts,
                progress=progress.update, pin_snapshot=False if args.no_pin else None,
                refetch=args.refetch,
            )  # fmt: skip
    return _emit(args, err, result, what, period)


def _emit(
    args: argparse.Namespace, err: Console, result: HistoryResult, what: str, period: int
) -> int:
    from rich.console import Console

    snapshot = f", snapshot {result.snapshot_id}" if result.snapshot_id else ""
    note = result.notification
    integrity = None if note is None else integrity_line(note)
    if not args.quiet:
        err.print(
            f"{result.status}: {len(result)} rows, request {result.request_id}{snapshot}, "
            f"{result.attempts} attempt(s), {result.elapsed_s:.1f}s",
            highlight=False,
        )
        if integrity is not None:
            err.print(f"integrity: {integrity}", highlight=False)
    if result.snapshot_note:  # even with --quiet: the rows may not be the notified ones
        err.print(f"note: {result.snapshot_note}", highlight=False, markup=False)
    if args.csv:
        write_csv(result.table, args.csv)
    if args.parquet:
        write_parquet(result.table, args.parquet)
    if result.empty:
        err.print(f"no candles for {what}", highlight=False)
        return EXIT_NOT_FOUND
    if getattr(args, "verify", False):  # `history` only; legacy answers carry no report
        if note is None or integrity is None:
            err.print("cannot verify: the platform sent no integrity report", highlight=False)
            return EXIT_INCOMPLETE
        if note.missing_candles:
            err.print(f"incomplete: {note.missing_candles} candles missing", highlight=False)
            return EXIT_INCOMPLETE
    if args.chart:
        from mdclient.chart import candlestick_png

        candlestick_png(result.table, args.chart, title=what, period_seconds=period)
    if not args.no_table:
        out = Console()
        if not out.is_terminal:  # piped: never squeeze numbers into an 80-column guess
            out = Console(width=max(out.width, 160))
        out.print(candle_table(result.table, title=what, max_rows=args.rows))
    return EXIT_OK


def cmd_live(args: argparse.Namespace, err: Console) -> int:
    from rich.console import Console

    from mdclient.dispatch import SequenceEvent
    from mdclient.live import describe_status

    ticker = _ticker(args.ticker)
    try:
        periods = [timeparse.parse_period(p) for p in args.ohlc]
    except timeparse.TimeFormatError as exc:
        raise UsageError(str(exc)) from None
    want_ticks = args.ticks or not periods
    settings = settings_from_args(args)
    out = Console(highlight=False, soft_wrap=True)

    def on_status(status: FeedStatus) -> None:  # stderr: stdout stays data only
        err.print(f"status: {describe_status(status)}", highlight=False, markup=False)

    def on_sequence(event: SequenceEvent) -> None:  # gaps and their recovery, also stderr
        err.print(f"sequence: {event.describe()}", highlight=False, markup=False)

    with (
        _client(settings) as client,
        client.live(
            ticker, ticks=want_ticks, ohlc=periods, on_status=on_status, on_sequence=on_sequence
        ) as s,
    ):
        if not args.quiet:
            err.print(f"streaming {', '.join(s.topics)} (Ctrl-C to stop)", highlight=False)
        for message in _until(s, args.count, args.duration):
            out.print(live_line(message), markup=False)
        if s.dropped and not args.quiet:
            err.print(f"{s.dropped} messages dropped (terminal too slow)")
    return EXIT_OK


def cmd_book(args: argparse.Namespace, err: Console) -> int:
    from rich.console import Console

    ticker = _ticker(args.ticker)
    if args.depth < 1:
        raise UsageError("--depth must be at least 1")
    settings = settings_from_args(args)
    out = Console(highlight=False, soft_wrap=True)
    if args.at is not None:
        return _stored_book(ticker, args, settings, out, err)
    from mdclient.book import BookEvent

    def on_event(event: BookEvent) -> None:  # stderr: stdout stays data only
        err.print(f"book: {event.describe()}", highlight=False, markup=False)

    def on_status(status: FeedStatus) -> None:
        from mdclient.live import describe_status

        err.print(f"status: {describe_status(status)}", highlight=False, markup=False)

    with _client(settings) as client:
        precision = client.precision(ticker)  # before the stream: Iceberg, once
        with client.book(ticker, on_event=on_event, on_status=on_status) as b:
            if not args.quiet:
                err.print(f"streaming {ticker}|book (Ctrl-C to stop)", highlight=False)
            _show_book(b, ticker, args, out, precision)
    return EXIT_OK


def _show_book(
    b: BookStream, ticker: str, args: argparse.Namespace, out: Console, precision: Precision
) -> None:
    with _LadderView(out, precision, redraw=out.is_terminal and not args.once) as view:
        for _ in _until(b, 1 if args.once else args.count, args.duration):
            bids, asks = b.depth(args.depth)
            if args.once:  # the first message applied is the snapshot: the book is whole
                view.ladder(ticker, bids, asks)
            else:
                view.update(ticker, bids, asks, in_sync=b.in_sync)


def _stored_book(
    ticker: str, args: argparse.Namespace, settings: ClientSettings, out: Console, err: Console
) -> int:
    """`book --at`: Iceberg only, like `markets`."""
    from mdclient.book import read_book_at, read_precision
    from mdclient.frames import IcebergReader
    from mdproto.error_codes import NO_BOOK

    try:
        at_ms = timeparse.parse_time(args.at, now_ms=int(time.time() * 1000))
    except timeparse.TimeFormatError as exc:
        raise UsageError(str(exc)) from None
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    try:
        book = read_book_at(reader, settings, ticker, at_ms)
    except errors.StorageError as exc:
        if exc.error_code != NO_BOOK:
            raise
        err.print(str(exc), highlight=False, markup=False)
        return EXIT_NOT_FOUND
    err.print(
        f"{ticker} book stored at {timeparse.format_ms(book.exchange_time_ms)}", highlight=False
    )
    precision = read_precision(reader, settings, ticker)
    for line in ladder_lines(book.bids.top(args.depth), book.asks.top(args.depth), precision):
        out.print(line, markup=False)
    return EXIT_OK


class _LadderView:
    """The live ladder: redrawn in place on a terminal (rich Live), else one line per update."""

    def __init__(self, out: Console, precision: Precision, *, redraw: bool) -> None:
        from rich.live import Live

        self._out = out
        self._precision = precision
        self._live = Live(console=out, auto_refresh=False, transient=False) if redraw else None

    def __enter__(self) -> _LadderView:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, ticker: str, bids: list[Level], asks: list[Level], *, in_sync: bool) -> None:
        line = book_line(ticker, bids, asks, self._precision)
        line += "" if in_sync else "  (out of sync)"
        if self._live is None:
            self._out.print(line, markup=False)
            return
        from rich.text import Text

        lines = [line, *ladder_lines(bids, asks, self._precision)]
        self._live.update(Text("\n".join(lines)), refresh=True)

    def ladder(self, ticker: str, bids: list[Level], asks: list[Level]) -> None:
        self._out.print(book_line(ticker, bids, asks, self._precision), markup=False)
        for line in ladder_lines(bids, asks, self._precision):
            self._out.print(line, markup=False)


def cmd_status(args: argparse.Namespace, err: Console) -> int:
    """An outcome comes from Iceberg alone (works while the relay is down); without one,
    the relays tell PENDING (accepted, running) from UNKNOWN (none remembers it)."""
    from mdclient.frames import IcebergReader
    from mdclient.request_status import status_from_row

    if not topics.is_valid_id(args.request_id):
        raise UsageError(f"{args.request_id!r}: a request_id is 1-128 characters of [A-Za-z0-9_.-]")
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    status = status_from_row(
        args.request_id, reader.read_request(settings.requests_table, args.request_id)
    )
    if status is None:
        with _client(settings) as client:
            status = client.status(args.request_id)
    note = status.notification
    if note is None:
        table = settings.requests_table
        if status.state == "PENDING":
            since = timeparse.format_ms(status.accepted_at_ms)
            print(f"{args.request_id}: PENDING (accepted {since}; no outcome in {table} yet)")
            return EXIT_PENDING
        print(
            f"{args.request_id}: UNKNOWN (no outcome in {table}, and no relay remembers "
            f"accepting it: never submitted, refused, or accepted more than "
            f"{status.remembered_s} s ago or before a relay restart)"
        )
        return EXIT_UNKNOWN
    where = describe(note.ticker, note.period_seconds, note.start_time_ms, note.end_time_ms)
    reason = f", {note.error_code or 'error'}: {note.reason}" if status.state == "ERROR" else ""
    snapshot = f", {note.iceberg_table} snapshot {note.snapshot_id}" if note.snapshot_id else ""
    done = timeparse.format_ms(note.completed_at_ms) if note.completed_at_ms else "?"
    print(
        f"{note.request_id}: {status.state}, {note.row_count} rows, {where}{snapshot}"
        f"{reason}, completed {done}"
    )
    integrity = integrity_line(note)
    if integrity is not None:
        print(f"integrity: {integrity}")
    return {"OK": EXIT_OK, "NOT_FOUND": EXIT_NOT_FOUND}.get(status.state, EXIT_FAILED)


def cmd_markets(args: argparse.Namespace, err: Console) -> int:
    """Reads Iceberg only (no relay): works while the relay is down."""
    import pyarrow.compute as pc
    from rich.console import Console

    from mdclient.client import exchange_name
    from mdclient.frames import IcebergReader

    exchange = exchange_name(args.exchange)
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    rows = reader.read_markets(settings.markets_table, exchange)
    if args.active:
        rows = rows.filter(pc.field(Markets.ACTIVE))
    if rows.num_rows == 0:
        which = "active markets" if args.active else "markets"
        err.print(f"no {which} of {exchange} in {settings.markets_table}", highlight=False)
        return EXIT_NOT_FOUND
    out = Console()
    if not out.is_terminal:
        out = Console(width=max(out.width, 160))
    out.print(market_table(rows, title=f"{exchange}: {rows.num_rows} markets"))
    return EXIT_OK


def cmd_recording(args: argparse.Namespace, err: Console) -> int:
    """Reads Iceberg only (no relay), like `markets`. The notes (gap counts unknown, each
    unrepairable gap) follow the table on stdout; after CSV or JSON they go to stderr."""
    import json

    from rich.console import Console

    from mdclient.client import exchange_name
    from mdclient.frames import IcebergReader
    from mdclient.recording import read_recording

    exchange = exchange_name(args.exchange) if args.exchange else None
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    status = read_recording(reader, settings, exchange, int(time.time() * 1000))
    notes_to = err
    if args.format == "json":
        print(json.dumps(status.as_dict(), indent=2))
    elif args.format == "csv":
        write_recording_csv(status, sys.stdout)
    elif status.markets:
        notes_to = Console()
        if not notes_to.is_terminal:
            notes_to = Console(width=max(notes_to.width, 160))
        notes_to.print(recording_table(status))
    if not status.markets:
        where = f" of {exchange}" if exchange else ""
        gaps = "" if status.gaps_note else f", no gaps in {settings.gaps_table}"
        err.print(
            f"nothing recorded{where}: no trades in {settings.ticks_table}{gaps}",
            highlight=False,
            markup=False,
        )
    for line in recording_notes(status):
        notes_to.print(line, highlight=False, markup=False, soft_wrap=True)
    return EXIT_OK if status.markets else EXIT_NOT_FOUND


def cmd_trades(args: argparse.Namespace, err: Console) -> int:
    from mdclient import trades_cli

    return trades_cli.run(args, err)


def cmd_trigger(args: argparse.Namespace, err: Console) -> int:
    from mdclient import trigger_cli

    with _client(settings_from_args(args)) as client:
        return trigger_cli.run(args, err, client)


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "history": cmd_history,
    "legacy": cmd_legacy,
    "live": cmd_live,
    "book": cmd_book,
    "status": cmd_status,
    "markets": cmd_markets,
    "recording": cmd_recording,
    "trades": cmd_trades,
    "trigger": cmd_trigger,
}


# --- helpers ---


def parse_range_args(args: argparse.Namespace) -> tuple[str, int, int, int]:
    """(ticker, period_seconds, start_ms, end_ms) from the command line, or UsageError."""
    ticker = _ticker(args.ticker)
    try:
        period = timeparse.parse_period(args.period)
        start_ms, end_ms = timeparse.parse_range(
            args.start, args.end, now_ms=int(time.time() * 1000)
        )
    except timeparse.TimeFormatError as exc:
        raise UsageError(str(exc)) from None
    if args.attempts is not None and args.attempts < 1:
        raise UsageError("--attempts must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    return ticker, period, start_ms, end_ms


def describe(ticker: str, period: int, start_ms: int, end_ms: int) -> str:
    """`BINANCE:BTC/USDT 1m [2026-11-20T00:00:00Z, 2026-11-21T00:00:00Z)`"""
    start, end = timeparse.format_ms(start_ms), timeparse.format_ms(end_ms)
    return f"{ticker} {timeparse.format_period(period)} [{start}, {end})"


def _until(stream: QueueStream[T], count: int | None, duration: float | None) -> Iterator[T]:
    """The stream's messages, `count` at most, for `duration` seconds (None: no limit); a
    stream ended by an error (FAILED, REFUSED: its reason went to stderr) raises it."""
    deadline = time.monotonic() + duration if duration else None
    taken = 0
    while count is None or taken < count:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        message = stream.get(timeout_s=remaining)
        if message is None:
            if stream.error is not None:
                raise stream.error
            continue
        taken += 1
        yield message


def _ticker(text: str) -> str:
    from mdproto import ProtocolError, topics

    ticker = text.strip().upper()
    try:
        topics.parse_ticker(ticker)
    except ProtocolError as exc:
        raise UsageError(exc.reason) from None
    return ticker


def _client(settings: ClientSettings) -> Client:
    from mdclient.client import Client

    return Client(settings=settings)


class _Progress:
    """Spinner with elapsed time and attempt on stderr (silent when not a terminal)."""

    def __init__(self, console: Console, what: str, *, quiet: bool) -> None:
        self._console = console
        self._what = what
        self._enabled = not quiet
        self._started = time.monotonic()
        self._status: Any = None

    def __enter__(self) -> _Progress:
        if self._enabled:
            self._status = self._console.status(f"connecting for {self._what}")
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def note(self, text: str) -> None:
        if self._status is not None:
            self._status.update(f"{text}: {self._what}")

    def update(self, event: ProgressEvent) -> None:
        if self._status is None:
            return
        attempt = f"attempt {event.attempt}/{event.attempts}"
        text = {
            "subscribing": "subscribing",
            "submitting": "submitting",
            "waiting": "waiting for the pipeline",
            "retrying": "no answer, retrying",
            "reading": "reading Iceberg",
            "done": "done",
        }[event.phase]
        self._status.update(
            f"{text} {self._what} - {event.elapsed_s:.1f}s, {attempt}", spinner="dots"
        )


def _setup_logging(verbose: bool) -> None:
    level = "DEBUG" if verbose else os.environ.get("LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "WARNING",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


# --- rendering ---

PRICE_COLUMNS = (Ohlc.OPEN, Ohlc.HIGH, Ohlc.LOW, Ohlc.CLOSE)
_SOURCES = {
    HistorySource.SOURCE_EXCHANGE: "from the exchange",
    HistorySource.SOURCE_STORAGE: "from storage (the exchange was not asked)",
    HistorySource.SOURCE_STORAGE_AND_EXCHANGE: "from storage, the gaps from the exchange",
}


def integrity_line(note: HistoryReadyNotification) -> str | None:
    """The notification's integrity report in one line; None from a platform without it."""
    if note.expected_candles == 0:
        return None
    missing = f"{note.missing_candles} missing" if note.missing_candles else "none missing"
    return (
        f"{note.expected_candles} candle slots: {note.row_count} rows, "
        f"{note.exchange_gaps} without trades at the exchange, {missing}; "
        f"{_SOURCES.get(note.source, 'source unknown')}"
    )


def check_writable(path: Path) -> None:
    """Fail before the request, not after a long wait: the folder must exist."""
    parent = path.expanduser().resolve().parent
    if not parent.is_dir():
        raise FileNotFoundError(f"folder {parent} does not exist (for output {path})")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a file name")


def decimals_for(values: list[float]) -> int:
    """Enough decimals for the typical magnitude: BTC 2, ETH/alts 4, sub-cent coins 8."""
    magnitudes = [abs(v) for v in values if v == v]  # skip NaN
    if not magnitudes:
        return 2
    typical = statistics.median(magnitudes)
    if typical >= 1000:
        return 2
    if typical >= 1:
        return 4
    return 8


def _table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def candle_table(table: pa.Table, *, title: str, max_rows: int = 20) -> Table:
    """A rich table; with more than `max_rows` rows shows the head and the tail."""
    rows = table.to_pylist()
    decimals = decimals_for([row[Ohlc.CLOSE] for row in rows])
    out = _table(title)
    out.add_column("open_time (UTC)", no_wrap=True)
    for name in (*PRICE_COLUMNS, "volume", "trades"):
        out.add_column(name, justify="right", no_wrap=True)
    shown: list[dict[str, Any] | None] = list(rows)
    if 0 < max_rows < len(rows):
        head = max_rows // 2
        tail = max_rows - head
        shown = [*rows[:head], None, *rows[-tail:]]
    for row in shown:
        if row is None:
            hidden = len(rows) - max_rows
            out.add_row(f"… {hidden} more rows", *["…"] * 6, style="dim")
            continue
        out.add_row(
            row[Ohlc.OPEN_TIME].strftime("%Y-%m-%d %H:%M:%S"),
            *(f"{row[name]:.{decimals}f}" for name in PRICE_COLUMNS),
            f"{row[Ohlc.VOLUME]:.4f}",
            "" if row[Ohlc.TRADE_COUNT] is None else str(row[Ohlc.TRADE_COUNT]),  # unknown: blank
        )
    return out


MARKET_NUMBERS = (
    ("price step", Markets.PRICE_PRECISION),
    ("amount step", Markets.AMOUNT_PRECISION),
    ("min amount", Markets.MIN_AMOUNT),
    ("max amount", Markets.MAX_AMOUNT),
    ("min price", Markets.MIN_PRICE),
    ("max price", Markets.MAX_PRICE),
    ("min cost", Markets.MIN_COST),
)


def market_table(table: pa.Table, *, title: str) -> Table:
    """Rows of Iceberg `market.markets`: 0 in a precision or limit is "not given" (-)."""
    out = _table(title)
    out.add_column("ticker", no_wrap=True)
    out.add_column("active")
    for header, _ in MARKET_NUMBERS:
        out.add_column(header, justify="right", no_wrap=True)
    out.add_column("updated (UTC)", no_wrap=True)
    for row in table.to_pylist():
        updated = row[Markets.UPDATED_AT]
        out.add_row(
            row[Markets.TICKER],
            "yes" if row[Markets.ACTIVE] else "no",
            *(f"{row[name]:g}" if row[name] else "-" for _, name in MARKET_NUMBERS),
            updated.strftime("%Y-%m-%d %H:%M:%S") if updated is not None else "-",
            style=None if row[Markets.ACTIVE] else "dim",
        )
    return out


_STATE_STYLES = {"repairing": "yellow", "incomplete": "red", "unknown": "dim"}


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    return timeparse.format_ms(ms - ms % 1000).replace("T", " ").removesuffix("Z")


def recording_table(status: RecordingStatus) -> Table:
    """One line per recorded market; gap counts "?" when market.gaps was not read."""
    where = f" of {status.exchange}" if status.exchange else ""
    out = _table(f"Recording{where}: {len(status.markets)} markets (today = {status.day} UTC)")
    out.add_column("ticker", no_wrap=True)
    out.add_column("state", no_wrap=True)
    out.add_column("since (UTC)", no_wrap=True)
    out.add_column("last trade (UTC)", no_wrap=True)
    out.add_column("trades today", justify="right", no_wrap=True)
    for header in ("gaps open", "repairing", "repaired", "unrepairable"):
        out.add_column(header, justify="right", no_wrap=True)
    for market in status.markets:
        gaps = market.gaps
        counts = (
            ["?"] * 4
            if gaps is None
            else [str(gaps.open), str(gaps.repairing), str(gaps.repaired), str(gaps.unrepairable)]
        )
        out.add_row(
            market.ticker,
            market.state,
            _utc(market.since_ms),
            _utc(market.last_trade_ms),
            f"{market.trades_today:,}",
            *counts,
            style=_STATE_STYLES.get(market.state),
        )
    return out


def lost_gap_line(gap: LostGap) -> str:
    """One unrepairable gap: where, why it opened, what is known lost, and the reason."""
    missing = f", {gap.missing_ids:,} ids missing" if gap.missing_ids else ""
    return (
        f"unrepairable: {gap.ticker} {_utc(gap.from_time_ms)} -> {_utc(gap.to_time_ms)} "
        f"({gap.cause or 'cause unknown'}{missing}, {gap.trades_recovered:,} recovered): "
        f"{gap.reason or 'no reason given'}"
    )


def recording_notes(status: RecordingStatus) -> list[str]:
    """The lines a person must not miss: gap counts unknown, and every unrepairable gap."""
    lines = [f"gaps unknown: {status.gaps_note}"] if status.gaps_note else []
    return lines + [lost_gap_line(gap) for gap in status.lost_gaps]


RECORDING_CSV = (
    "ticker", "state", "since", "since_ms", "last_trade", "last_trade_ms", "trades_today",
    "gaps_open", "gaps_repairing", "gaps_repaired", "gaps_unrepairable", "unrepairable_reasons",
)  # fmt: skip


def write_recording_csv(status: RecordingStatus, out: TextIO) -> None:
    """ISO times plus epoch ms, as the candle CSV; unknown gap counts are empty fields."""
    import csv

    def iso(ms: int | None) -> str:
        return "" if ms is None else timeparse.format_ms(ms)

    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RECORDING_CSV)
    for m in status.markets:
        gaps = m.gaps
        counts = (
            ["", "", "", ""]
            if gaps is None
            else [gaps.open, gaps.repairing, gaps.repaired, gaps.unrepairable]
        )
        writer.writerow(
            [
                m.ticker, m.state, iso(m.since_ms), m.since_ms if m.since_ms is not None else "",
                iso(m.last_trade_ms), m.last_trade_ms if m.last_trade_ms is not None else "",
                m.trades_today, *counts, " | ".join(g.reason for g in m.unrepairable),
            ]
        )  # fmt: skip


def write_csv(table: pa.Table, path: Path) -> None:
    """CSV with ISO-8601 UTC open_time plus open_time_ms for scripts.

    The csv module, not pandas (an optional extra): an unknown (null) trade
    count is an empty field, and numbers are written as Python prints them.
    """
    import csv

    import pyarrow as pa

    names = list(table.column_names)
    at = names.index(Ohlc.OPEN_TIME) + 1
    micros = table.column(Ohlc.OPEN_TIME).cast(pa.int64()).to_pylist()
    with path.open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*names[:at], "open_time_ms", *names[at:]])
        for row, us in zip(table.to_pylist(), micros, strict=True):
            values = [row[name] for name in names]
            values[at - 1] = row[Ohlc.OPEN_TIME].strftime("%Y-%m-%dT%H:%M:%SZ")
            writer.writerow([*values[:at], us // 1000, *values[at:]])


def write_parquet(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def live_line(message: LiveMessage) -> str:
    """One terminal line per live message."""
    if isinstance(message, OHLC):
        # A correction re-publishes a closed candle a late trade changed (docs/protocol.md).
        state = "fixed " if message.correction else "closed" if message.closed else "open  "
        trades = message.trade_count if message.HasField("trade_count") else ""
        return (
            f"{timeparse.format_ms(message.open_time_ms)}  {message.ticker}  "
            f"ohlc:{timeparse.format_period(message.period_seconds):>3} {state}  "
            f"O {message.open:g}  H {message.high:g}  L {message.low:g}  C {message.close:g}  "
            f"V {message.volume:g}  n {trades}"
            + ("  incomplete" if message.incomplete else "")  # trades lost to a feed gap
        )
    side = TakerSide.Name(message.side).replace("SIDE_UNSPECIFIED", "-")
    return (
        f"{timeparse.format_ms(message.timestamp_ms)}  {message.ticker}  tick  {side:<4}  "
        f"{message.price:g} x {message.amount:g}  #{message.trade_id}"
    )


def book_line(
    ticker: str, bids: list[Level], asks: list[Level], precision: Precision = _AS_THEY_COME
) -> str:
    """One line per book update: the best of each side and the spread, prices at the
    market's tick size (`Client.precision`)."""
    p = precision
    bid = f"{p.price(bids[0][0])} x {p.amount(bids[0][1])}" if bids else "-"
    ask = f"{p.price(asks[0][0])} x {p.amount(asks[0][1])}" if asks else "-"
    spread = p.price(price_difference(asks[0][0], bids[0][0])) if bids and asks else "-"
    return (
        f"{timeparse.format_ms(int(time.time() * 1000))}  {ticker}  book  bid {bid}  "
        f"ask {ask}  spread {spread}  levels {len(bids)}/{len(asks)}"
    )


def ladder_lines(
    bids: list[Level], asks: list[Level], precision: Precision = _AS_THEY_COME
) -> list[str]:
    """The ladder: asks above (best lowest, next to the spread), bids below, aligned;
    prices at the market's tick size, amounts at its lot size."""
    rows = [(price, amount) for price, amount in reversed(asks)]
    prices = [precision.price(p) for p, _ in (*rows, *bids)]
    amounts = [precision.amount(a) for _, a in (*rows, *bids)]
    width_p = max((len(p) for p in prices), default=0)
    width_a = max((len(a) for a in amounts), default=0)
    lines = []
    for i, (p, a) in enumerate(zip(prices, amounts, strict=True)):
        side = "ask" if i < len(rows) else "bid"
        lines.append(f"{side}  {p:>{width_p}}  {a:>{width_a}}")
    if rows and bids:
        spread = precision.price(price_difference(asks[0][0], bids[0][0]))
        lines.insert(len(rows), f"---  spread {spread}")
    return lines
