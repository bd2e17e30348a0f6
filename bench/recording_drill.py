"""The recording drill: a recorded universe through faults, checked against the simulator.

    .venv/bin/python bench/recording_drill.py [--minutes 10] [--exchanges binance,bybit,okx]
                                              [--compose]

Starts a whole local platform (the same processes as `make run`, on free ports), or
with `--compose` the Docker Compose platform with the simulator (as `make e2e` does:
a Docker engine needed; the compose files from MDP_COMPOSE_FILES, e.g.
`docker-compose.yml:infra/images/compose.yml` for the offline image set), recording
BTC/USDT, ETH/USDT and SOL/USDT of each exchange, with no client subscribed. Once
every market's trades reach Iceberg the window opens, and:

- minute 1: the simulator drops 5 trade ids of the first exchange's BTC/USDT stream;
- minute 2: it cuts the second exchange's ETH/USDT websocket for 2 minutes, and the
  third's BTC/USDT (Bybit keeps only its latest 60 trades over REST: a 2-minute gap
  of BTC there is more, so it must end UNREPAIRABLE, saying why);
- minute 4: the ingestor (process or container) is killed (SIGKILL) and started again;
- at `--minutes` the window closes.

Then, once every market was recorded past the window and no gap is open, it checks
Iceberg `market.ticks` against the simulator's own trades of the window for every
market, trade for trade (id, price, amount, time: none missing outside an
UNREPAIRABLE gap, none twice), lists `market.gaps`, and (once the pipeline rebuilt
them, or after 15 minutes) counts the stored one-minute candles over each repaired
gap still marked incomplete. Exit 0 when all hold.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from infra.compose_platform import compose_files, compose_session
from infra.exchange_sim.control import SimulatorControl
from infra.exchange_sim.model import MarketModel
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.platform.faults import Faults, LocalFaults
from infra.platform.supervisor import PlatformEndpoints
from infra.testing import RecordedLake, check_recording, epoch_ms
from ingestor.venues import venue_for
from mdproto.tables import Gaps

MARKETS = ("BTC/USDT", "ETH/USDT", "SOL/USDT")
MINUTE_S = 60.0


def say(text: str) -> None:
    print(f"[drill {time.strftime('%H:%M:%S')}] {text}", flush=True)


def wait(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"drill: not within {timeout_s:g} s: {what}")
        time.sleep(every_s)


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="the window's length")
    parser.add_argument("--exchanges", default="binance,okx,bybit", help="three ccxt ids")
    parser.add_argument("--compose", action="store_true", help="on the Docker Compose platform")
    args = parser.parse_args()
    exchanges = [e.strip() for e in args.exchanges.split(",") if e.strip()]
    assert len(exchanges) == 3, "three exchanges: dropped ids, a cut, and Bybit's long cut"
    prefixes = [venue_for(e).platform_prefix(e) for e in exchanges]
    tickers = [f"{p}:{m}" for p in prefixes for m in MARKETS]

    with tempfile.TemporaryDirectory(prefix="recording-drill-") as tmp_name:
        data_dir = Path(tmp_name)
        say(f"starting the platform: {', '.join(tickers)} recorded")
        if args.compose:
            os.environ["MDP_EXCHANGES"] = ",".join(exchanges)  # docker-compose.yml's ingestor
            files = [*compose_files(), recording_overlay(data_dir, exchanges)]
            with compose_session(files=files) as running:
                endpoints = running.endpoints.platform_endpoints()
                return drill(endpoints, running, exchanges, prefixes, tickers, args.minutes)
        config = PlatformConfig(
            data_dir=data_dir, ports=ServicePorts.free(), exchanges=exchanges, start_timeout_s=600
        )
        stack = StackConfig(data_dir=data_dir, ports=Ports.free())
        with Platform(config, stack_config=stack, use_simulator=True) as platform:
            return drill(
                platform.endpoints,
                LocalFaults(platform),
                exchanges,
                prefixes,
                tickers,
                args.minutes,
            )


def recording_overlay(directory: Path, exchanges: list[str]) -> str:
    """A compose file recording MARKETS of every exchange (as infra/compose/e2e.yml
    does for the e2e suite's markets)."""
    universe = {e: {"markets": list(MARKETS), "channels": ["trades", "book"]} for e in exchanges}
    path = directory / "drill-recording.yml"
    environment = {"INGESTOR_RECORDING__EXCHANGES": json.dumps(universe)}
    path.write_text(json.dumps({"services": {"ingestor": {"environment": environment}}}))
    return str(path)


def drill(
    endpoints: PlatformEndpoints,
    faults: Faults,
    exchanges: list[str],
    prefixes: list[str],
    tickers: list[str],
    minutes: float,
) -> int:
    assert endpoints.exchange_url is not None
    sim = SimulatorControl(endpoints.exchange_url)
    lake = RecordedLake(
        endpoints.stack.catalog_name, endpoints.stack.pyiceberg_catalog_properties(), tickers
    )
    wait("every market in market.ticks", lambda: len(lake.newest_ms()) == len(tickers), 600)
    begin_ms = max(lake.newest_ms().values())
    opened = time.monotonic()
    say("window open: every market's trades are in Iceberg")

    def at(minute: float) -> None:
        time.sleep(max(0.0, opened + minute * MINUTE_S - time.monotonic()))

    at(1)
    sim.trade_drop("BTC/USDT", count=5, exchange=exchanges[0])
    say(f"{prefixes[0]}:BTC/USDT: 5 trade ids dropped")
    at(2)
    sim.ws_outage(symbol="ETH/USDT", exchange=exchanges[1], seconds=120)
    sim.ws_outage(symbol="BTC/USDT", exchange=exchanges[2], seconds=120)
    say(f"{prefixes[1]}:ETH/USDT and {prefixes[2]}:BTC/USDT: websockets cut for 2 minutes")
    at(4)
    faults.crash("ingestor")
    say("the ingestor was killed (SIGKILL) and is back")
    at(minutes)
    end_ms = int(time.time() * 1000)
    say("window closed; waiting for every market past it and every gap settled")

    def settled() -> bool:
        newest = lake.newest_ms(end_ms)
        open_gaps = [g for g in lake.gaps(begin_ms) if g[Gaps.STATUS] in ("OPEN", "REPAIRING")]
        return all(newest.get(t, 0) > end_ms for t in tickers) and not open_gaps

    wait("recorded past the window, no gap open", settled, 600)
    gaps = lake.gaps(begin_ms)

    def rebuilt() -> bool:  # the pipeline rebuilds them a while after the repair
        repaired = [g for g in gaps if g[Gaps.STATUS] == "REPAIRED"]
        return all(
            lake.candles_over(
                g[Gaps.TICKER], 60, epoch_ms(g[Gaps.FROM_TIME]), epoch_ms(g[Gaps.TO_TIME])
            )[1]
            == 0
            for g in repaired
        )

    try:
        wait("the candles over every repaired gap rebuilt complete", rebuilt, 900)
    except SystemExit as late:
        say(str(late))  # the table below shows which are still incomplete
    ticks = lake.ticks(begin_ms)
    model = MarketModel()
    ok = True
    print(f"\nwindow {(end_ms - begin_ms) / 60_000:.1f} min, {len(tickers)} markets")
    print("| market | traded | stored | missing | in unrepairable gaps | wrong or twice |")
    print("|---|---:|---:|---:|---:|---:|")
    for ticker in tickers:
        traded = list(model.iter_trades(ticker.split(":")[1], begin_ms, end_ms))
        check = check_recording(ticks, gaps, ticker, traded, begin_ms, end_ms)
        ok = ok and check.ok
        print(
            f"| {ticker} | {check.traded} | {check.stored} | {len(check.missing)} |"
            f" {check.unrepairable} | {len(check.extra)} |"
        )
    print("\n| gap | cause | status | missing ids | recovered | incomplete 1m candles | reason |")
    print("|---|---|---|---:|---:|---:|---|")
    for g in sorted(gaps, key=lambda g: g[Gaps.DETECTED_AT]):
        span = (epoch_ms(g[Gaps.FROM_TIME]), epoch_ms(g[Gaps.TO_TIME]))
        stored, incomplete = lake.candles_over(g[Gaps.TICKER], 60, *span)
        if g[Gaps.STATUS] == "REPAIRED" and incomplete:
            ok = False
        print(
            f"| {g[Gaps.TICKER]} {g[Gaps.FROM_TRADE_ID]}..{g[Gaps.TO_TRADE_ID]} |"
            f" {g[Gaps.CAUSE]} | {g[Gaps.STATUS]} | {g[Gaps.MISSING_IDS]} |"
            f" {g[Gaps.TRADES_RECOVERED]} | {incomplete} of {stored} | {g[Gaps.REASON]} |"
        )
    print(f"\n{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
