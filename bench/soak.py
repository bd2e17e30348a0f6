"""Soak a running `make run`: live tickers and a history request a minute, for a while.

Issue 25's "done when": the platform left running with 10 live tickers and a
history request every minute shows no catalog HTTP 500, no component restarted
(a commit must never take a process down) and answers every request.

    make run                                   # one shell
    .venv/bin/python bench/soak.py --minutes 30 --tickers 10   # another

It attaches to the platform the way a user's second shell does (mdclient's
default settings), so it measures `make run` itself, not a test copy. The
tickers are distinct active markets the platform lists (`mdclient markets`),
the exchange simulator's most liquid first (it has 11 markets that trade every
minute; its illiquid XYZ/USDT and delisted OLD/USDT come last or not at all), so
every one of them delivers live ticks; live data needs an exchange the simulator
streams (BINANCE, the default, or BYBIT: `EXCHANGES=bybit make run`). Each
request asks for a different past hour of a different ticker: every one is
fetched, committed and notified, none is answered from storage. At the end it
reads what happened beside it: component pid files (a changed pid is a
restart), and the new part of the catalog's and the pipeline's logs (HTTP 500s,
commits of unknown outcome, queries failed or restarted in-process; commit
conflicts that were retried, the designed path, are counted apart). Exit 0 only
when all is clean.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.soak import LogWatch, live_tickers, pids, say
from mdclient import Client, ClientSettings

REPO = Path(__file__).resolve().parents[1]
HOUR_MS = 3_600_000

#: Lines in the catalog's log that mean a commit was answered with a server error.
CATALOG_ERRORS = re.compile(r"SQLITE_BUSY|UncheckedSQLException|\b500\b|Internal Server Error")
#: Lines in the pipeline's log that mean a commit's outcome was unknown or a query died.
PIPELINE_ERRORS = re.compile(r"CommitStateUnknownException|query \S+ failed|restarted from")
#: A commit that lost a race (409) and was retried: the designed path, counted, not a failure.
RETRIED_COMMITS = re.compile(r"Retrying task after failure")


@dataclass
class Outcome:
    """One history request: what came back, and how long submit -> rows took."""

    ticker: str
    ok: bool
    rows: int
    seconds: float
    error: str = ""


def soak(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    logs = data_dir / "logs"
    catalog_log = LogWatch(logs / "iceberg-rest.log")
    pipeline_log = LogWatch(logs / "spark-pipeline.log")
    started_pids = pids(data_dir)
    if not started_pids:
        print(f"no pid files under {data_dir}: is `make run` running?", file=sys.stderr)
        return 2

    settings = ClientSettings()
    live_counts: Counter[str] = Counter()
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    with Client(settings=settings, client_id="soak") as client:
        tickers = live_tickers(client, args.exchange, args.tickers)

        def counter(ticker: str) -> Callable[[object], None]:
            def count(_message: object) -> None:
                with lock:
                    live_counts[ticker] += 1

            return count

        streams = [client.on_live(t, counter(t), ticks=True, ohlc=["1m"]) for t in tickers]
        say(f"soak: {len(tickers)} live tickers, a request every {args.interval_s:g} s, "
              f"{args.minutes:g} minutes")  # fmt: skip
        deadline = time.monotonic() + args.minutes * 60
        now_ms = int(time.time() * 1000)
        n = 0
        while time.monotonic() < deadline:
            began = time.monotonic()
            ticker = tickers[n % len(tickers)]
            start = (now_ms - (2 + n) * 24 * HOUR_MS) // HOUR_MS * HOUR_MS  # a fresh hour each
            try:
                result = client.history(ticker, "1m", start, start + HOUR_MS, timeout_s=120)
                outcome = Outcome(ticker, result.status == "OK", len(result), 0.0)
            except Exception as exc:  # reported, and the soak goes on
                outcome = Outcome(ticker, False, 0, 0.0, f"{type(exc).__name__}: {exc}")
            outcome.seconds = time.monotonic() - began
            outcomes.append(outcome)
            with lock:
                seen = sum(1 for t in tickers if live_counts[t])
            say(
                f"  {n + 1:3d} {ticker:22s} {'OK' if outcome.ok else 'FAILED':6s} "
                f"{outcome.rows:3d} rows {outcome.seconds:5.1f} s   live: {seen}/{len(tickers)} "
                f"tickers, {sum(live_counts.values())} messages {outcome.error}"
            )
            n += 1
            time.sleep(max(0.0, args.interval_s - (time.monotonic() - began)))
        for stream in streams:
            stream.close()

    restarted = sorted(k for k, v in pids(data_dir).items() if started_pids.get(k) not in (None, v))
    catalog_errors = catalog_log.matches(CATALOG_ERRORS)
    pipeline_errors = pipeline_log.matches(PIPELINE_ERRORS)
    retried = len(pipeline_log.matches(RETRIED_COMMITS))
    failed = [o for o in outcomes if not o.ok]
    silent = [t for t in tickers if not live_counts[t]]
    times = sorted(o.seconds for o in outcomes if o.ok)

    print("\n| check | result |\n|---|---|")
    print(f"| history requests answered | {len(outcomes) - len(failed)} of {len(outcomes)} |")
    if times:
        print(
            f"| submit -> rows, median / max | {times[len(times) // 2]:.1f} s / {times[-1]:.1f} s |"
        )
    print(f"| live tickers that delivered | {len(tickers) - len(silent)} of {len(tickers)} |")
    print(f"| catalog server errors (500) | {len(catalog_errors)} |")
    print(f"| commits of unknown outcome, queries failed or restarted | {len(pipeline_errors)} |")
    print(f"| commit conflicts retried (409, by design) | {retried} |")
    print(f"| components restarted | {', '.join(restarted) or 'none'} |")
    for line in [*catalog_errors, *pipeline_errors][:20]:
        print(f"  log: {line}")
    clean = not (failed or silent or catalog_errors or pipeline_errors or restarted)
    return 0 if clean else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--tickers", type=int, default=10)
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--exchange", default="BINANCE")
    parser.add_argument("--data-dir", default=str(REPO / ".data"))
    sys.exit(soak(parser.parse_args()))


if __name__ == "__main__":
    main()
