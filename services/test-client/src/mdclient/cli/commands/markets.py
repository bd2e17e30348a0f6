"""`mdclient markets EXCHANGE`: an exchange's markets from Iceberg `market.markets`.
Reads Iceberg only (no relay): works while the relay is down."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mdclient.cli.args import settings_from_args
from mdclient.cli.commands import Subparsers
from mdclient.cli.output import market_table, stdout_console
from mdclient.exit_codes import ExitCode
from mdproto.tables import Markets

if TYPE_CHECKING:
    from rich.console import Console


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    markets = sub.add_parser(
        "markets", parents=[common], help="an exchange's markets (Iceberg market.markets)"
    )
    markets.add_argument("exchange", help="e.g. BINANCE")
    markets.add_argument("--active", action="store_true", help="only markets that trade")


def run(args: argparse.Namespace, err: Console) -> int:
    import pyarrow.compute as pc

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
        return ExitCode.NOT_FOUND
    stdout_console().print(market_table(rows, title=f"{exchange}: {rows.num_rows} markets"))
    return ExitCode.OK
