"""``python -m infra.exchange_sim --port 8765``: run the simulator until SIGINT/SIGTERM.

Prints ``exchange-sim listening on <base_url>`` once it accepts connections
(and writes the base URL to ``--ready-file`` if given) so a supervisor using
``--port 0`` can learn the port without polling guesses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from .server import SimulatorServer


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
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    server = SimulatorServer(
        host=args.host,
        port=args.port,
        now_ms=args.now_ms,
        trade_rate=_trade_rate(args.trade_rate),
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
