"""Command-line input every command shares: the common options, settings from them,
and the checks that turn bad input into `UsageError` (exit 2) before any network."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mdclient import timeparse
from mdclient.config import ClientSettings, load_settings


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


def parse_range_args(args: argparse.Namespace) -> tuple[str, int | str, int, int]:
    """(ticker, period, start_ms, end_ms) from the command line, or UsageError. The period
    is seconds, or the canonical tick or volume bars ("100ticks", "2.5vol")."""
    from mdclient.errors import InvalidRequest
    from mdclient.history import bars_name

    ticker = parse_ticker(args.ticker)
    try:
        period: int | str = bars_name(args.period) or timeparse.parse_period(args.period)
        start_ms, end_ms = timeparse.parse_range(
            args.start, args.end, now_ms=int(time.time() * 1000)
        )
    except (timeparse.TimeFormatError, InvalidRequest) as exc:
        raise UsageError(str(exc)) from None
    if args.attempts is not None and args.attempts < 1:
        raise UsageError("--attempts must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    return ticker, period, start_ms, end_ms


def parse_ticker(text: str) -> str:
    from mdproto import ProtocolError, topics

    ticker = text.strip().upper()
    try:
        topics.parse_ticker(ticker)
    except ProtocolError as exc:
        raise UsageError(exc.reason) from None
    return ticker


def add_stored_range(parser: argparse.ArgumentParser, what: str) -> argparse._ArgumentGroup:
    """`--start`, `--end` and the output options (`--rows`, `--no-table`, `--csv`,
    `--parquet`) of a read of stored rows (`trades`, `book-samples`); returns the output
    group."""
    parser.add_argument(
        "--start", default="-1h", help="now, -1h, 2026-11-20, 2026-11-20T10:00, epoch ms"
    )
    parser.add_argument("--end", default="now", help="same formats; range is [start, end)")
    out = parser.add_argument_group("output")
    out.add_argument("--rows", type=int, default=20, help="table rows: head+tail (0 = all)")
    out.add_argument("--no-table", action="store_true", help="print no table")
    out.add_argument("--csv", type=Path, metavar="FILE", help=f"write the {what} as CSV")
    out.add_argument("--parquet", type=Path, metavar="FILE", help=f"write the {what} as Parquet")
    return out


def check_outputs(*paths: Path | None) -> None:
    """Fail before the request, not after a long wait: each output's folder must exist."""
    for path in paths:
        if path is None:
            continue
        parent = path.expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(f"folder {parent} does not exist (for output {path})")
        if path.is_dir():
            raise UsageError(f"{path} is a folder, not a file name")


def describe(ticker: str, period: int | str, start_ms: int, end_ms: int) -> str:
    """`BINANCE:BTC/USDT 1m [2026-11-20T00:00:00Z, 2026-11-21T00:00:00Z)` (or `100ticks`)"""
    start, end = timeparse.format_ms(start_ms), timeparse.format_ms(end_ms)
    what = period if isinstance(period, str) else timeparse.format_period(period)
    return f"{ticker} {what} [{start}, {end})"
