"""`mdclient book`: a live L2 ladder (redrawn in place on a terminal, else one line per
update), or with `--at` the exact book stored in Iceberg at a time (no relay needed);
`mdclient book-samples`: the stored book's top levels every step over a range."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from mdclient import errors, timeparse
from mdclient.cli.args import (
    UsageError,
    add_stored_range,
    check_outputs,
    parse_ticker,
    settings_from_args,
)
from mdclient.cli.commands import Subparsers, open_client
from mdclient.cli.output import stdout_console
from mdclient.cli.views import LadderView, ladder_lines, until
from mdclient.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.book import BookEvent, BookStream
    from mdclient.config import ClientSettings
    from mdproto.markets import Precision
    from mdproto.messages import FeedStatus


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
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
        "--at",
        metavar="TIME",
        help="the stored book at TIME: the snapshot before it and the deltas up to it "
        "(Iceberg; no relay needed; exit 11 if a delta is missing, the book shown as before it)",
    )
    samples = sub.add_parser(
        "book-samples",
        parents=[common],
        help="the stored book's top levels every step over a range (Iceberg)",
        description="The book of market.book_snapshots + market.book_deltas at start, "
        "start + every, ... before end: one row per sample with its best --depth levels per "
        "side (bid_price_0, bid_amount_0, ..., ask_amount_N), exact (no delta missing "
        "before it), book_time and exchange_sequence. No book stored in or before the "
        "range exits 6. Needs no relay.",
    )
    samples.add_argument("ticker", help="EXCHANGE:BASE/QUOTE")
    add_stored_range(samples, "samples")
    samples.add_argument("--every", default="1s", help="step: 100ms, 250 (ms), 1s, 1m (default 1s)")
    samples.add_argument("--depth", type=int, default=10, help="levels per side (default 10)")
    samples.add_argument(
        "--verify", action="store_true", help="exit 11 unless every sample is exact"
    )


def run(args: argparse.Namespace, err: Console) -> int:
    from rich.console import Console

    ticker = parse_ticker(args.ticker)
    if args.depth < 1:
        raise UsageError("--depth must be at least 1")
    settings = settings_from_args(args)
    out = Console(highlight=False, soft_wrap=True)
    if args.at is not None:
        return _stored_book(ticker, args, settings, out, err)

    def on_event(event: BookEvent) -> None:  # stderr: stdout stays data only
        err.print(f"book: {event.describe()}", highlight=False, markup=False)

    def on_status(status: FeedStatus) -> None:
        from mdclient.live import describe_status

        err.print(f"status: {describe_status(status)}", highlight=False, markup=False)

    with open_client(settings) as client:
        precision = client.precision(ticker)  # before the stream: Iceberg, once
        with client.book(ticker, on_event=on_event, on_status=on_status) as b:
            if not args.quiet:
                err.print(f"streaming {ticker}|book (Ctrl-C to stop)", highlight=False)
            _show_book(b, ticker, args, out, precision)
    return ExitCode.OK


def _show_book(
    b: BookStream, ticker: str, args: argparse.Namespace, out: Console, precision: Precision
) -> None:
    with LadderView(out, precision, redraw=out.is_terminal and not args.once) as view:
        for _ in until(b, 1 if args.once else args.count, args.duration):
            bids, asks = b.depth(args.depth)
            if args.once:  # the first message applied is the snapshot: the book is whole
                view.ladder(ticker, bids, asks)
            else:
                view.update(ticker, bids, asks, in_sync=b.in_sync)


def _stored_book(
    ticker: str, args: argparse.Namespace, settings: ClientSettings, out: Console, err: Console
) -> int:
    """`book --at`: Iceberg only, like `markets`."""
    from mdclient.book import read_precision
    from mdclient.book_history import read_book_at
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
        return ExitCode.NOT_FOUND
    err.print(
        f"{ticker} book at {timeparse.format_ms(at_ms)}: the snapshot of "
        f"{timeparse.format_ms(book.snapshot_time_ms)} and {book.deltas_applied} deltas, "
        f"the last at {timeparse.format_ms(book.exchange_time_ms)}",
        highlight=False,
        markup=False,
    )
    if not book.exact:
        err.print(f"not exact: {book.gap}", highlight=False, markup=False)
    precision = read_precision(reader, settings, ticker)
    for line in ladder_lines(book.bids.top(args.depth), book.asks.top(args.depth), precision):
        out.print(line, markup=False)
    return ExitCode.OK if book.exact else ExitCode.INCOMPLETE


def run_samples(args: argparse.Namespace, err: Console) -> int:
    """`book-samples`: Iceberg only, like `trades`."""
    from mdclient.book_history import read_book_samples, sample_range
    from mdclient.cli.output import sample_table, write_parquet, write_samples_csv
    from mdclient.frames import IcebergReader
    from mdproto.error_codes import NO_BOOK

    try:
        every_ms = timeparse.parse_step_ms(args.every)
        query = sample_range(
            parse_ticker(args.ticker),
            args.start,
            args.end,
            every_ms,
            args.depth,
            now_ms=int(time.time() * 1000),
        )
    except (errors.InvalidRequest, timeparse.TimeFormatError) as exc:
        raise UsageError(str(getattr(exc, "reason", exc))) from None
    if args.rows < 0:
        raise UsageError("--rows must be 0 or more")
    check_outputs(args.csv, args.parquet)
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    try:
        table = read_book_samples(reader, settings, query)
    except errors.StorageError as exc:
        if exc.error_code != NO_BOOK:
            raise
        err.print(str(exc), highlight=False, markup=False)
        return ExitCode.NOT_FOUND
    if args.csv is not None:
        write_samples_csv(table, args.csv)
    if args.parquet is not None:
        write_parquet(table, args.parquet)
    start, end = timeparse.format_ms(query.start_ms), timeparse.format_ms(query.end_ms)
    what = f"{query.ticker} book every {args.every} [{start}, {end})"
    inexact = table.num_rows - sum(table["exact"].to_pylist())
    if not args.quiet:
        err.print(f"{table.num_rows:,} samples: {what}", highlight=False, markup=False)
    if inexact:  # even with --quiet: it says what the rows are worth
        err.print(
            f"{inexact:,} samples not exact (before the first stored book, or between a "
            "missing delta and the next snapshot)",
            highlight=False,
            markup=False,
        )
    if not args.no_table:
        stdout_console().print(sample_table(table, title=what, max_rows=args.rows))
    if args.verify and inexact:
        return ExitCode.INCOMPLETE
    return ExitCode.OK
