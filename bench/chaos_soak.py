"""Chaos soak of a running `make run`: clients at work while every component is broken in turn.

    nice -n 10 make run                                         # one shell
    .venv/bin/python bench/chaos_soak.py --minutes 5            # another

For `--minutes` it keeps clients busy (history requests of random past ranges, live
ticks and 1-minute candles of the recorded markets with sequence checks, a book,
one-shot CEP triggers) while a fault injector, one fault at a time, SIGKILLs,
freezes (SIGSTOP, SIGCONT a few seconds later, or left to the supervisor's liveness
restart) and restarts (SIGTERM) the pipeline, the ingestor, the relay, the gateway
and the catalog, and cuts the exchange (the simulator closes and refuses its
websockets and answers REST with 503) and the catalog (SIGSTOP) for a while. The
schedule is `infra.chaos.FaultPlan`: it never spends more of `make run`'s crash
budget than it can afford. Each fault is logged with its time.

Then, once the platform's gap repair had its chance (bounded by `--settle-s`), it
checks the recorded markets (PLATFORM_RECORD: BTC, ETH, SOL of the first exchange)
against the simulator's own trades (`GET /_sim/trades`): no trade missing or stored
twice in ``market.ticks``, no closed 1-minute candle missing or twice in
``market.ohlc``; every history request answered with rows or refused with a code
within 10 s of its fault; every trigger whose threshold the market crossed fired
exactly once. It prints a table, writes it with the fault log as JSON and CSV
(`--out`), and exits 0 only when nothing was lost and nothing duplicated.

The soak itself (clients, injector, checks) is infra/chaos_soak.py, which
e2e/test_chaos_soak.py also runs, for 5 minutes on compose; this script attaches
it to `make run` (infra/chaos_platforms.py: `MakeRunBreaker`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from infra.chaos import compose_faults, fault_cycle
from infra.chaos_platforms import MakeRunBreaker
from infra.chaos_soak import SoakOptions, run_soak, write_results
from infra.platform.config import PlatformConfig
from infra.soak import say
from infra.testing import RecordedLake
from mdclient import ClientSettings

REPO = Path(__file__).resolve().parents[1]


def recorded_tickers(config: PlatformConfig) -> list[str]:
    return [f"{config.prefixes[0]}:{m}" for m in config.record]


def soak(args: argparse.Namespace) -> int:
    config = PlatformConfig()
    breaker = MakeRunBreaker.attach(config)
    if not breaker.alive():
        print(f"no `make run` supervising {config.data_dir}: start it first", file=sys.stderr)
        return 2
    tickers = recorded_tickers(config)
    stack = breaker.platform.stack.endpoints
    lake = RecordedLake(stack.catalog_name, stack.pyiceberg_catalog_properties(), tickers)
    options = SoakOptions(
        minutes=args.minutes,
        warmup_s=args.warmup_s,
        gap_s=args.gap_s,
        freeze_s=args.freeze_s,
        cut_s=args.cut_s,
        recover_s=args.recover_s,
        settle_s=args.settle_s,
        history_every_s=args.history_every_s,
        history_timeout_s=args.history_timeout_s,
        trigger_every_s=args.trigger_every_s,
        seed=args.seed,
    )
    plan = compose_faults if args.plan == "compose" else fault_cycle
    faults = plan(freeze_s=args.freeze_s, cut_s=args.cut_s)
    result = run_soak(breaker, ClientSettings(), lake, tickers, faults, options)
    for line in result.report():
        say(line)
    write_results(Path(args.out), result)
    say(f"{'PASS' if result.ok else 'FAIL'}: results in {args.out}")
    return 0 if result.ok else 1


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults go on")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="clients before faults")
    parser.add_argument("--gap-s", type=float, default=15.0, help="quiet time between faults")
    parser.add_argument("--freeze-s", type=float, default=8.0, help="a short freeze's length")
    parser.add_argument("--cut-s", type=float, default=30.0, help="an exchange or catalog cut")
    parser.add_argument("--recover-s", type=float, default=600.0, help="bound on a recovery")
    parser.add_argument("--settle-s", type=float, default=600.0, help="bound on gap repair")
    parser.add_argument("--history-every-s", type=float, default=10.0)
    parser.add_argument("--history-timeout-s", type=float, default=120.0)
    parser.add_argument("--trigger-every-s", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument(
        "--plan",
        choices=["cycle", "compose"],
        default="cycle",
        help="cycle: every kind of fault on every component, round after round, for"
        " --minutes; compose: make e2e's six faults once each, in its order (its soak"
        " reproduced on make run)",
    )
    parser.add_argument("--out", default=str(REPO / ".data" / "chaos-soak"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(soak(parser.parse_args()))


if __name__ == "__main__":
    main()
