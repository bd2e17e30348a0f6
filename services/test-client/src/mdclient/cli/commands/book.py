"""`mdclient book`: a live L2 ladder (redrawn in place on a terminal, else one line per
update), or with `--at` the book stored in Iceberg at a time (no relay needed)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from mdclient import errors, timeparse
from mdclient.cli.args import UsageError, parse_ticker, settings_from_args
from mdclient.cli.commands import Subparsers, open_client
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
        "--at", metavar="TIME", help="the stored book at TIME (Iceberg; no relay needed)"
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
        return ExitCode.NOT_FOUND
    err.print(
        f"{ticker} book stored at {timeparse.format_ms(book.exchange_time_ms)}", highlight=False
    )
    precision = read_precision(reader, settings, ticker)
    for line in ladder_lines(book.bids.top(args.depth), book.asks.top(args.depth), precision):
        out.print(line, markup=False)
    return ExitCode.OK
