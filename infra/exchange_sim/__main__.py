"""``python -m infra.exchange_sim --port 8765``: run the simulator until SIGINT/SIGTERM.

Prints ``exchange-sim listening on <base_url>`` once it accepts connections
(and writes the base URL to ``--ready-file`` if given) so a supervisor using
``--port 0`` can learn the port without polling guesses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from .server import SimulatorServer
from .universe import Universe


def _trade_rate(values: list[str]) -> float | dict[str, float] | None:
    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        return float(values[0])
    rates: dict[str, float] = {}
    for item in values:
        symbol, sep, rate = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected SYMBOL=RATE, got {item!r}")
        rates[symbol] = float(rate)
    return rates


#: The ``--universe*`` flags: name, ``Universe`` field, type, default, metavar, help.
UNIVERSE_FLAGS: tuple[tuple[str, str, type[int] | type[float], str, str, str], ...] = (
    ("universe", "markets", int, "0", "N", "markets to add (0: none)"),
    ("universe-rate", "rate", float, "1000", "TRADES_PER_S", "trades/s in all, outside bursts"),
    ("universe-skew", "skew", float, "1", "S", "Zipf exponent: rank r trades ~ r**-S"),
    ("universe-bursts", "burst_fraction", float, "0", "FRACTION", "share of burst minutes"),
    ("universe-burst-factor", "burst_factor", float, "5", "K", "rate in a burst minute, x"),
    ("universe-jitter", "jitter", float, "0.1", "SIGMA", "stdev of log minute rate (0: even)"),
    ("universe-book-ratio", "book_ratio", float, "1", "R", "book level changes per trade"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m infra.exchange_sim", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port; 0 picks a free one")
    parser.add_argument("--now-ms", type=int, default=None, help="freeze the clock at this time")
    parser.add_argument(
        "--trade-rate",
        action="append",
        default=[],
        metavar="RATE|SYMBOL=RATE",
        help="trades per second in traded minutes (all symbols, or per symbol; repeatable)",
    )
    parser.add_argument(
        "--no-model-trades",
        action="store_true",
        help="websocket streams carry only injected trades",
    )
    parser.add_argument(
        "--weight-limit",
        type=int,
        default=6000,
        help="Binance request weight per minute before 429 (0: unlimited)",
    )
    parser.add_argument("--ready-file", type=Path, default=None, help="write the base URL here")
    load = parser.add_argument_group(
        "universe (load generator)",
        "N more markets (U001/USDT ...) on every exchange, a Zipf law of trade rates; "
        "each flag defaults to its environment variable (SIM_UNIVERSE, SIM_UNIVERSE_RATE, "
        "...): how `make run` and compose set them",
    )
    for flag, _, kind, default, meta, text in UNIVERSE_FLAGS:
        env = "SIM_" + flag.upper().replace("-", "_")
        load.add_argument(
            f"--{flag}",
            type=kind,
            default=os.environ.get(env) or default,  # a str: argparse applies `type`
            metavar=meta,
            help=f"{text} (${env}, default {default})",
        )
    try:
        args = parser.parse_args(argv)
        args.universe = universe_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def universe_of(args: argparse.Namespace) -> Universe | None:
    """The ``--universe*`` flags as a ``Universe`` (None without ``--universe``)."""
    values = {field: getattr(args, flag.replace("-", "_")) for flag, field, *_ in UNIVERSE_FLAGS}
    return Universe(**values) if values["markets"] else None


async def _serve(args: argparse.Namespace) -> None:
    server = SimulatorServer(
        host=args.host,
        port=args.port,
        now_ms=args.now_ms,
        trade_rate=_trade_rate(args.trade_rate),
        universe=args.universe,
        stream_model_trades=not args.no_model_trades,
        weight_limit=args.weight_limit or None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.ready_file is not None:
            args.ready_file.write_text(server.base_url + "\n")
        print(f"exchange-sim listening on {server.base_url}", flush=True)
        if server.universe is not None:
            names = server.universe.symbols()
            print(
                f"exchange-sim universe: {len(names)} markets {names[0]}..{names[-1]}, "
                f"{server.universe.rate:g} trades/s",
                flush=True,
            )
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except OSError as exc:
        print(f"exchange-sim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
