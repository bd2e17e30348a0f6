"""The replay drill: issue 43's "Done when" on the recorded universe of `make run`.

    .venv/bin/python bench/replay_drill.py [--window-minutes 3] [--live-trades 20]

Starts a whole local platform (the same processes as `make run`, on free ports, the
simulator as the exchange) recording its default universe (Binance BTC/USDT, ETH/USDT
and SOL/USDT, trades and books) with no client subscribed. Once a whole window of
`--window-minutes` of BTC and ETH is in Iceberg (trades after its end, the candle
closing at its end, book changes after it: waited for, never slept), it checks:

1. trades through three doors: BTC's trades from its first recorded one to the
   window's end through `Client.trades`, `mdclient trades --parquet` (a subprocess)
   and the gateway's `GET /trades?format=parquet`, each equal to the `market.ticks`
   rows of the range read with pyiceberg, each with its integrity report; a range
   before the recording began is `not_recorded` through all three (NotRecorded,
   exit 6, 404), never an empty answer;
2. replay at 10x of the window, BTC and ETH, `trades,book,ohlc:60`, through the SDK
   and the gateway's WebSocket `/replay` at once: every stored trade, book change
   and candle of the window (against the Iceberg rows, stream by stream), each topic
   numbered 1..n, in event-time order, each message a live PUB frame of its topic
   (the gateway: the live `message` and `book` frames), then "replay complete";
3. resume: the same replay in a subprocess that prints every message (its live
   frames) with the cursor after it, SIGKILLed once it printed half of (2)'s
   messages, then resumed from the last cursor it printed: the union is (2)'s
   delivery, no trade twice;
4. into live: `Client.replay_into_live(BTC, "-2m")` until `--live-trades` trades came
   after the seam; once those are stored, the trades delivered are the
   `market.ticks` rows and the simulator's own trades of [start, last delivered],
   each once, in id order: no gap and no duplicate at the seam.

Prints a PASS/FAIL table with figures; exit 0 when all hold.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from recording_drill import say, wait

from infra.exchange_sim.model import MarketModel
from infra.localstack import Ports, StackConfig
from infra.platform import Platform, PlatformConfig, ServicePorts
from infra.testing import RecordedLake, iso_ms, platform_client, poll_until
from mdclient import Client
from mdclient.errors import NotRecorded, ReplaySeamTimeout
from mdclient.replay import Replay, ReplayComplete
from mdclient.trades import REPORT_KEY
from mdproto import contracts, envelope, topics
from mdproto.messages import OHLC, BookDelta, BookSnapshot, Tick
from mdproto.tables import BookDeltas, BookSnapshots, Ohlc, Ticks

MINUTE_MS = 60_000
CHANNELS = ("trades", "book", "ohlc:60")
SPEED = 10
RECORDED_MINUTES = 4  # of trades, books and candles in Iceberg before the checks
NOT_FOUND_EXIT = 6  # mdclient.exit_codes.ExitCode.NOT_FOUND: what a script sees
ReplayMessage = Tick | OHLC | BookSnapshot | BookDelta
Delivered = list[tuple[str, ReplayMessage]]  # (topic, message) in delivery order


@dataclass(frozen=True)
class Row:
    """One line of the drill's table."""

    check: str
    ok: bool
    figures: str


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--window-minutes", type=int, default=3, help="the replayed window")
    parser.add_argument("--live-trades", type=int, default=20, help="trades after the seam (4)")
    parser.add_argument("--child-replay", help=argparse.SUPPRESS)  # check 3's subprocess
    args = parser.parse_args()
    if args.child_replay:
        return child_replay(json.loads(args.child_replay))
    with tempfile.TemporaryDirectory(prefix="replay-drill-") as tmp_name:
        data_dir = Path(tmp_name)
        config = PlatformConfig(data_dir=data_dir, ports=ServicePorts.free(), start_timeout_s=600)
        tickers = [f"{config.prefixes[0]}:{market}" for market in config.record]
        say(f"starting the platform: {', '.join(tickers)} recorded, no client subscribed")
        stack = StackConfig(data_dir=data_dir, ports=Ports.free())
        with Platform(config, stack_config=stack, use_simulator=True) as platform:
            return drill(platform, tickers, data_dir, args.window_minutes, args.live_trades)


def drill(
    platform: Platform, tickers: list[str], data_dir: Path, minutes: int, live_trades: int
) -> int:
    endpoints = platform.endpoints
    lake = RecordedLake(
        endpoints.stack.catalog_name, endpoints.stack.pyiceberg_catalog_properties(), tickers
    )
    pair = tickers[:2]  # BTC and ETH: replayed; BTC: the three doors and into live
    begin_ms = wait_begin(lake, pair)
    start_ms, end_ms = begin_ms, begin_ms + minutes * MINUTE_MS
    first_ms = min(micros(window(lake, contracts.ICEBERG_TICKS, pair[0]), Ticks.TRADE_TIME)) // 1000
    say(
        f"recording began ({pair[0]}'s first trade {clock(first_ms)}); waiting for the window"
        f" [{clock(start_ms)}, {clock(end_ms)}) stored and {RECORDED_MINUTES} minutes recorded"
    )
    wait(
        "the window's trades, candles and book changes in Iceberg",
        lambda: stored(lake, pair, max(end_ms, first_ms + RECORDED_MINUTES * MINUTE_MS)),
        600 + minutes * 90,
    )
    say(f"window stored; load {load()}")
    settings = platform_client(platform)
    env = {**os.environ, **endpoints.client_env()}
    rows: list[Row] = []
    with Client(settings=settings) as client:
        rows += guarded(
            "1 trades through three doors",
            lambda: three_doors(
                client, lake, env, endpoints.gateway, data_dir, pair[0], first_ms, end_ms
            ),
        )
        full: Delivered = []
        rows += guarded(
            "2 replay at 10x",
            lambda: replay_window(client, lake, endpoints.gateway, pair, start_ms, end_ms, full),
        )
        rows += guarded(
            "3 resume after SIGKILL", lambda: resume(client, env, pair, start_ms, end_ms, full)
        )
        rows += guarded("4 replay into live", lambda: into_live(client, lake, pair[0], live_trades))
    ok = all(row.ok for row in rows)
    print(f"\n{minutes}-minute window [{clock(start_ms)}, {clock(end_ms)}), load {load()}")
    print("| check | result | figures |\n|---|---|---|")
    for row in rows:
        print(f"| {row.check} | {'PASS' if row.ok else 'FAIL'} | {row.figures} |")
    print(f"\n{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def guarded(name: str, check: Callable[[], list[Row]]) -> list[Row]:
    """The check's rows; one that breaks is a FAIL row with its error, and the drill goes
    on with the next (they are independent but for 3 needing 2's delivery)."""
    say(f"check {name}")
    try:
        found = check()
    except Exception as exc:  # a broken check is a finding: report it, run the others
        traceback.print_exc()
        return [Row(name, False, f"raised {type(exc).__name__}: {exc}")]
    for row in found:
        say(f"  {'PASS' if row.ok else 'FAIL'} {row.check}: {row.figures}")
    return found


# --- readiness ------------------------------------------------------------------------------


#: Each table's time column: what a window of it selects on (the ticker column is
#: `ticker` in every one).
TIME_OF = {
    contracts.ICEBERG_TICKS: Ticks.TRADE_TIME,
    contracts.ICEBERG_OHLC: Ohlc.OPEN_TIME,
    contracts.ICEBERG_BOOK_SNAPSHOTS: BookSnapshots.SNAPSHOT_TIME,
    contracts.ICEBERG_BOOK_DELTAS: BookDeltas.DELTA_TIME,
}
FOREVER_MS = 4_102_444_800_000  # 2100-01-01
ONE_MINUTE = f"{Ohlc.PERIOD_SECONDS} = 60"


def window(
    lake: RecordedLake,
    table: str,
    ticker: str,
    lo_ms: int = 0,
    hi_ms: int = FOREVER_MS,
    more: str = "",
) -> pa.Table:
    """`table`'s rows of `ticker` with their time in [lo_ms, hi_ms) (and `more`), read
    with pyiceberg; LookupError while the table does not exist."""
    at = TIME_OF[table]
    rows = lake.rows(
        table,
        f"{Ticks.TICKER} = '{ticker}' AND {at} >= '{iso_ms(lo_ms)}' AND {at} < '{iso_ms(hi_ms)}'"
        + (f" AND {more}" if more else ""),
    )
    if rows is None:
        raise LookupError(f"{table} does not exist yet")
    return rows


def count(lake: RecordedLake, table: str, ticker: str, lo_ms: int, more: str = "") -> int:
    """How many rows `window` has from `lo_ms` on; 0 while the table does not exist."""
    try:
        return int(window(lake, table, ticker, lo_ms, more=more).num_rows)
    except LookupError:
        return 0


def micros(table: pa.Table, name: str) -> list[int]:
    """A timestamp column as epoch µs."""
    return [int(us) for us in table.column(name).cast(pa.int64()).to_pylist()]


def column(table: pa.Table, name: str) -> list[Any]:
    values: list[Any] = table.column(name).to_pylist()
    return values


def wait_begin(lake: RecordedLake, tickers: Sequence[str]) -> int:
    """The first whole minute after every ticker's first stored trade and book snapshot:
    from there on the recording holds whole minutes, and a book to start from."""
    firsts: dict[str, int] = {}

    def begun() -> bool:
        for ticker in tickers:
            if not count(lake, contracts.ICEBERG_TICKS, ticker, 0) or not count(
                lake, contracts.ICEBERG_BOOK_SNAPSHOTS, ticker, 0
            ):
                return False
            trades = micros(window(lake, contracts.ICEBERG_TICKS, ticker), Ticks.TRADE_TIME)
            books = window(lake, contracts.ICEBERG_BOOK_SNAPSHOTS, ticker)
            firsts[ticker] = (
                max(min(trades), min(micros(books, BookSnapshots.SNAPSHOT_TIME))) // 1000
            )
        return True

    wait("every replayed market's trades and books in Iceberg", begun, 600)
    return -(-max(firsts.values()) // MINUTE_MS) * MINUTE_MS


def stored(lake: RecordedLake, tickers: Sequence[str], end_ms: int) -> bool:
    """Each ticker has a trade and a book change stored after `end_ms` and the 1-minute
    candle closing at it: the pipeline stored everything before it."""
    return all(
        count(lake, contracts.ICEBERG_TICKS, ticker, end_ms)
        and count(lake, contracts.ICEBERG_BOOK_DELTAS, ticker, end_ms)
        and count(lake, contracts.ICEBERG_OHLC, ticker, end_ms - MINUTE_MS, ONE_MINUTE)
        for ticker in tickers
    )


# --- 1: three doors ---------------------------------------------------------------------------


def three_doors(
    client: Client,
    lake: RecordedLake,
    env: Mapping[str, str],
    gateway: str,
    data_dir: Path,
    ticker: str,
    start_ms: int,
    end_ms: int,
) -> list[Row]:
    want = trade_rows(window(lake, contracts.ICEBERG_TICKS, ticker, start_ms, end_ms))
    span = f"[{clock(start_ms)}, {clock(end_ms)})"
    sdk = client.trades(ticker, start_ms, end_ms)
    cli_file = data_dir / "cli-trades.parquet"
    cli = cli_trades(env, ticker, start_ms, end_ms, cli_file)
    status, headers, body = http_get(
        gateway, "/trades", ticker=ticker, start=start_ms, end=end_ms, format="parquet"
    )
    answers: list[tuple[str, pa.Table | None, dict[str, Any] | None, str]] = [
        ("SDK `client.trades`", sdk.table, sdk.report.as_dict(), ""),
        (
            "CLI `mdclient trades --parquet`",
            pq.read_table(cli_file) if cli.returncode == 0 else None,
            file_report(pq.read_schema(cli_file)) if cli.returncode == 0 else None,
            f"exit {cli.returncode}",
        ),
        (
            "gateway `GET /trades` (Parquet)",
            pq.read_table(io.BytesIO(body)) if status == 200 else None,
            file_report(pq.read_schema(io.BytesIO(body))) if status == 200 else None,
            f"HTTP {status}, X-Integrity-State {headers.get('X-Integrity-State')}",
        ),
    ]
    out = []
    sdk_says = report_key(sdk.report.as_dict())
    for door, table, report, note in answers:
        got = trade_rows(table) if table is not None else None
        ok = got == want and report is not None and report_key(report) == sdk_says
        shown = "no report" if report is None else describe_report(report)
        found = "no rows" if got is None else f"{len(got):,} rows"
        figures = f"{found} ({len(want):,} in Iceberg); {shown}; {note or 'ok'}"
        out.append(Row(f"1 {ticker} trades {span}: {door} = market.ticks", ok, figures))
    out.append(not_recorded(client, env, gateway, data_dir, ticker, start_ms))
    return out


def trade_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Every column of `market.ticks`, rows in (trade time, trade id) order."""
    order = [(Ticks.TRADE_TIME, "ascending"), (Ticks.TRADE_ID, "ascending")]
    rows: list[dict[str, Any]] = (
        table.take(pc.sort_indices(table, order)).select(list(Ticks.SCHEMA.names)).to_pylist()
    )
    return rows


def report_key(report: Mapping[str, Any]) -> tuple[Any, ...]:
    """What every door's report of one range must agree on (the newest trade moves on)."""
    counts = report.get("gap_counts") or {}
    fields = ("state", "recorded_since_ms", "not_recorded_until_ms")
    return (*(report.get(name) for name in fields), tuple(sorted(counts.items())))


def file_report(schema: pa.Schema) -> dict[str, Any] | None:
    raw = (schema.metadata or {}).get(REPORT_KEY)
    return None if raw is None else dict(json.loads(raw))


def describe_report(report: Mapping[str, Any]) -> str:
    counts = report.get("gap_counts") or {}
    gaps = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "none"
    since = report.get("recorded_since_ms")
    return (
        f"integrity {report['state']}, recorded since {clock(int(since)) if since else '-'},"
        f" gaps {gaps}"
    )


def not_recorded(
    client: Client,
    env: Mapping[str, str],
    gateway: str,
    data_dir: Path,
    ticker: str,
    first_ms: int,
) -> Row:
    """An hour before the recording began: said to be not recorded by every door."""
    lo, hi = first_ms - 3_600_000, first_ms - MINUTE_MS
    seen = []
    try:
        answer = client.trades(ticker, lo, hi)
        seen.append(f"SDK answered {len(answer):,} rows ({answer.report.state})")
        sdk_ok = False
    except NotRecorded as exc:
        seen.append(f"SDK NotRecorded ({exc.report.state}: {exc.reason})")
        sdk_ok = exc.report.state == "not_recorded"
    cli = cli_trades(env, ticker, lo, hi, data_dir / "before.parquet")
    seen.append(f"CLI exit {cli.returncode}")
    status, _, body = http_get(
        gateway, "/trades", ticker=ticker, start=lo, end=hi, format="parquet"
    )
    error = json.loads(body) if status == 404 else {}
    state = (error.get("integrity") or {}).get("state")
    seen.append(f"gateway HTTP {status} {error.get('error_code')} ({state})")
    ok = (
        sdk_ok
        and cli.returncode == NOT_FOUND_EXIT
        and status == 404
        and error.get("error_code") == "not_recorded"
        and state == "not_recorded"
    )
    return Row(
        f"1 {ticker} trades [{clock(lo)}, {clock(hi)}), before the recording", ok, "; ".join(seen)
    )


def cli_trades(
    env: Mapping[str, str], ticker: str, start_ms: int, end_ms: int, parquet: Path
) -> subprocess.CompletedProcess[str]:
    """`mdclient trades` as a user runs it, in its own process, to a Parquet file."""
    times = ["--start", str(start_ms), "--end", str(end_ms)]
    command = [
        sys.executable,
        "-m",
        "mdclient",
        "trades",
        ticker,
        *times,
        "--parquet",
        str(parquet),
    ]
    done = subprocess.run(
        [*command, "--no-table", "-q"], env=dict(env), capture_output=True, text=True, timeout=300
    )
    if done.returncode not in (0, NOT_FOUND_EXIT):
        say(f"  mdclient trades: exit {done.returncode}: {done.stderr.strip()[-400:]}")
    return done


def http_get(base: str, path: str, **query: object) -> tuple[int, Mapping[str, str], bytes]:
    url = f"{base}{path}?{urllib.parse.urlencode({k: str(v) for k, v in query.items()})}"
    try:
        with urllib.request.urlopen(url, timeout=300) as response:
            return int(response.status), dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), dict(error.headers), error.read()


# --- 2: the replay of the window --------------------------------------------------------------


def replay_window(
    client: Client,
    lake: RecordedLake,
    gateway: str,
    tickers: Sequence[str],
    start_ms: int,
    end_ms: int,
    full: Delivered,
) -> list[Row]:
    """The SDK's and the gateway's replay of the window at once; `full` gets the SDK's."""
    expected = {
        topic: want
        for ticker in tickers
        for topic, want in stored_streams(lake, ticker, start_ms, end_ms).items()
    }
    span = f"[{clock(start_ms)}, {clock(end_ms)})"
    with ThreadPoolExecutor(1) as pool:
        socket = pool.submit(
            gateway_replay, gateway, tickers, start_ms, end_ms, 120 + (end_ms - start_ms) / 1000
        )
        began = time.monotonic()
        replay = client.replay(tickers, start_ms, end_ms, channels=CHANNELS, speed=SPEED)
        got, done = take(replay)
        took = time.monotonic() - began
        frames = socket.result()
    full.extend(got)
    problems = delivery_problems(got, expected, start_ms)
    per_topic = by_topic(got)
    if done is None:
        problems.append("no replay complete marker")
    elif dict(done.per_topic) != {t: len(m) for t, m in per_topic.items()}:
        problems.append(f"the marker counts {dict(done.per_topic)}")
    counts = "; ".join(
        f"{topic} {stream_count(topic, per_topic.get(topic, [])):,}/{len(want):,}"
        for topic, want in expected.items()
    )
    window_s = (end_ms - start_ms) / 1000
    sdk = Row(
        f"2 replay {span} x{SPEED}, SDK `client.replay`: every stored message in order, live"
        " frames, marker",
        not problems,
        f"delivered/stored: {counts} (+ the book before the window per book); {took:.1f} s for"
        f" {window_s:.0f} s of events (x{window_s / took:.1f}){listed(problems)}",
    )
    return [sdk, gateway_row(frames, got, span)]


def stream_count(topic: str, messages: Sequence[ReplayMessage]) -> int:
    """The stored messages a topic delivered: a book topic's first is the book before."""
    return max(0, len(messages) - 1) if topic.endswith("|book") else len(messages)


def listed(problems: Sequence[str]) -> str:
    return f"; PROBLEMS: {'; '.join(problems[:5])}" if problems else ""


def stored_streams(
    lake: RecordedLake, ticker: str, start_ms: int, end_ms: int
) -> dict[str, list[tuple[Any, ...]]]:
    """Per topic, the stored rows of the window as (kind, identity), in the order a
    replay must deliver them: trades by (time, id), candles by open time, book changes
    by (time, exchange sequence, delta before snapshot, Kafka offset)."""
    ticks = window(lake, contracts.ICEBERG_TICKS, ticker, start_ms, end_ms)
    candles = window(lake, contracts.ICEBERG_OHLC, ticker, start_ms, end_ms, ONE_MINUTE)
    snapshots = window(lake, contracts.ICEBERG_BOOK_SNAPSHOTS, ticker, start_ms, end_ms)
    deltas = window(lake, contracts.ICEBERG_BOOK_DELTAS, ticker, start_ms, end_ms)
    trades = sorted(
        zip(micros(ticks, Ticks.TRADE_TIME), column(ticks, Ticks.TRADE_ID), strict=True)
    )
    snapshot_keys = zip(
        micros(snapshots, BookSnapshots.SNAPSHOT_TIME),
        column(snapshots, BookSnapshots.EXCHANGE_SEQUENCE),
        strict=True,
    )
    delta_keys = zip(
        micros(deltas, BookDeltas.DELTA_TIME),
        column(deltas, BookDeltas.EXCHANGE_SEQUENCE),
        column(deltas, BookDeltas.KAFKA_OFFSET),
        strict=True,
    )
    changes = sorted(
        [(us, seq, 1, 0, "BookSnapshot") for us, seq in snapshot_keys]
        + [(us, seq, 0, offset, "BookDelta") for us, seq, offset in delta_keys]
    )
    return {
        topics.tick_topic(ticker): [("Tick", trade_id) for _, trade_id in trades],
        topics.book_topic(ticker): [(kind, seq) for _, seq, _, _, kind in changes],
        topics.ohlc_topic(ticker, 60): [
            ("OHLC", us // 1000) for us in sorted(micros(candles, Ohlc.OPEN_TIME))
        ],
    }


def identity(message: ReplayMessage) -> tuple[Any, ...]:
    """What `stored_streams` lists a message as."""
    if isinstance(message, Tick):
        return ("Tick", message.trade_id)
    if isinstance(message, OHLC):
        return ("OHLC", message.open_time_ms)
    return (type(message).__name__, message.exchange_sequence)


def event_ms(message: ReplayMessage) -> int:
    """When the live topic publishes it: a trade's time, a candle's close, a change's time."""
    if isinstance(message, Tick):
        return int(message.timestamp_ms)
    if isinstance(message, OHLC):
        return int(message.open_time_ms) + int(message.period_seconds) * 1000
    return int(message.exchange_time_ms)


def take(replay: Replay) -> tuple[Delivered, ReplayComplete | None]:
    got: Delivered = []
    for message in replay:
        if isinstance(message, ReplayComplete):
            return got, message
        got.append((replay.topic, message))
    return got, None


def by_topic(got: Iterable[tuple[str, ReplayMessage]]) -> dict[str, list[ReplayMessage]]:
    out: dict[str, list[ReplayMessage]] = {}
    for topic, message in got:
        out.setdefault(topic, []).append(message)
    return out


def delivery_problems(
    got: Delivered, expected: Mapping[str, list[tuple[Any, ...]]], start_ms: int
) -> list[str]:
    """What is wrong with a delivery of the window: a stream that differs from its stored
    rows, a sequence with a gap, an event out of order, a message that is not a live
    frame of its topic. A book topic starts with the book just before the window."""
    problems = []
    streams = by_topic(got)
    for topic in sorted(set(streams) | set(expected)):
        messages = streams.get(topic, [])
        if [m.sequence for m in messages] != list(range(1, len(messages) + 1)):
            problems.append(f"{topic}: sequence not 1..{len(messages)}")
        if topic.endswith("|book"):
            if (
                not messages
                or not isinstance(messages[0], BookSnapshot)
                or event_ms(messages[0]) >= start_ms
            ):
                problems.append(f"{topic}: does not start with the book before the window")
            messages = messages[1:]
        have = [identity(m) for m in messages]
        want = expected.get(topic, [])
        if have != want:
            missing = len(set(want) - set(have))
            extra = len(set(have) - set(want))
            problems.append(
                f"{topic}: {len(have)} delivered, {len(want)} stored, {missing} missing,"
                f" {extra} not stored or out of order"
            )
    starts = {id(m[0]) for t, m in streams.items() if t.endswith("|book") and m}
    times = [event_ms(m) for _, m in got if id(m) not in starts]
    late = sum(1 for a, b in itertools.pairwise(times) if b < a)
    if late:
        problems.append(f"{late} messages before the one ahead of them in event time")
    for topic, message in got:
        if envelope.decode_sub(envelope.encode_pub(topic, message)) != (topic, message):
            problems.append(f"{topic}: a {type(message).__name__} is not its live frame")
            break
        if topic != live_topic(message):
            problems.append(f"{topic}: carries a message of {live_topic(message)}")
            break
    return problems


def live_topic(message: ReplayMessage) -> str:
    if isinstance(message, Tick):
        return topics.tick_topic(message.ticker)
    if isinstance(message, OHLC):
        return topics.ohlc_topic(message.ticker, message.period_seconds)
    return topics.book_topic(message.ticker)


def gateway_replay(
    base: str, tickers: Sequence[str], start_ms: int, end_ms: int, timeout_s: float
) -> list[dict[str, Any]]:
    """The frames of the gateway's WebSocket `/replay` of the window, up to its
    `replay_complete` (or `error`)."""
    import aiohttp

    url = base.replace("http", "ws", 1) + "/replay"
    params = {
        "tickers": ",".join(tickers),
        "start": str(start_ms),
        "end": str(end_ms),
        "channels": ",".join(CHANNELS),
        "speed": str(SPEED),
    }

    async def run() -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, params=params, max_msg_size=0) as ws,
        ):
            async for received in ws:
                if received.type != aiohttp.WSMsgType.TEXT:
                    break
                frames.append(json.loads(received.data))
                if frames[-1]["type"] in ("replay_complete", "error"):
                    break
        return frames

    return asyncio.run(asyncio.wait_for(run(), timeout_s))


def gateway_row(frames: list[dict[str, Any]], sdk: Delivered, span: str) -> Row:
    """The gateway's frames against the SDK's delivery: a live `message` frame per trade
    and candle (the same trades), a `book` ladder per book change, the same marker."""
    streams = by_topic(sdk)
    kinds: dict[str, dict[str, int]] = {}
    trade_ids: dict[str, list[str]] = {}
    for frame in frames:
        topic = str(frame.get("topic") or "")
        kinds.setdefault(topic, {}).setdefault(frame["type"], 0)
        kinds[topic][frame["type"]] += 1
        if frame["type"] == "message" and topic.endswith("|tick"):
            trade_ids.setdefault(topic, []).append(str(frame["data"]["trade_id"]))
    last = frames[-1] if frames else {}
    problems = []
    if last.get("type") != "replay_complete":
        problems.append(f"ends with {last.get('type')}: {last.get('reason', '')}")
    for topic, messages in streams.items():
        kind = "book" if topic.endswith("|book") else "message"
        sent = kinds.get(topic, {}).get(kind, 0)
        if sent != len(messages):
            problems.append(f"{topic}: {sent} {kind} frames for {len(messages)} messages")
        if topic.endswith("|tick") and trade_ids.get(topic) != [
            m.trade_id for m in messages if isinstance(m, Tick)
        ]:
            problems.append(f"{topic}: other trades than the SDK's")
    marker = {t: int(n) for t, n in (last.get("per_topic") or {}).items()}
    if marker != {t: len(m) for t, m in streams.items()}:
        problems.append(f"replay_complete counts {marker}")
    cursors = sum(k.get("replay_cursor", 0) for k in kinds.values())
    shown = ", ".join(f"{n:,} {kind}" for kind, n in sorted(count_kinds(kinds).items()))
    return Row(
        f"2 replay {span} x{SPEED}, gateway WebSocket `/replay`: live frames = the SDK's, marker",
        not problems,
        f"{len(frames):,} frames ({shown}; {cursors} cursor frames){listed(problems)}",
    )


def count_kinds(kinds: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_topic in kinds.values():
        for kind, n in per_topic.items():
            out[kind] = out.get(kind, 0) + n
    return out


# --- 3: killed halfway, resumed -----------------------------------------------------------------


def child_replay(spec: Mapping[str, Any]) -> int:
    """Check 3's subprocess: the SDK replay of the window, one line per message on stdout
    (its live PUB frames, base64) with the cursor after it, as a consumer that saves
    its cursor would."""
    with Client() as client:
        replay = client.replay(
            spec["tickers"], spec["start"], spec["end"], channels=CHANNELS, speed=SPEED
        )
        for line in replay_lines(replay):
            print(line, flush=True)
    return 0


def replay_lines(replay: Replay) -> Iterator[str]:
    """A line per message: its live PUB frames (base64) and the cursor after it; the
    marker's count last."""
    for message in replay:
        if isinstance(message, ReplayComplete):
            yield json.dumps({"complete": message.messages})
            return
        frames = envelope.encode_pub(replay.topic, message)
        encoded = [base64.b64encode(f).decode() for f in frames]
        yield json.dumps({"frames": encoded, "cursor": replay.cursor})


def resume(
    client: Client,
    env: Mapping[str, str],
    tickers: Sequence[str],
    start_ms: int,
    end_ms: int,
    full: Delivered,
) -> list[Row]:
    name = (
        f"3 replay x{SPEED} in a subprocess SIGKILLed halfway, resumed from its last printed"
        " cursor: exactly the rest"
    )
    if not full:
        return [Row(name, False, "no delivery of (2) to compare with")]
    spec = json.dumps({"tickers": list(tickers), "start": start_ms, "end": end_ms})
    command = [sys.executable, __file__, "--child-replay", spec]
    head, cursor, code = killed_child(
        command, env, len(full) // 2, 300 + (end_ms - start_ms) / 1000
    )
    if code != -signal.SIGKILL or cursor is None:
        return [Row(name, False, f"the child ended {code} after {len(head)} messages")]
    again = client.replay(tickers, start_ms, end_ms, channels=CHANNELS, speed=SPEED, cursor=cursor)
    rest, done = take(again)
    union, books, problems = resumed(head, rest)
    if done is None:
        problems.append("the resumed replay has no marker")
    same = plain(union) == plain(full)
    if not same:
        problems.append(f"head {len(head)} + rest {len(union) - len(head)} != (2)'s {len(full)}")
    trades = [m.trade_id for _, m in union if isinstance(m, Tick)]
    twice = len(trades) - len(set(trades))
    return [
        Row(
            name,
            not problems and twice == 0,
            f"killed after {len(head):,} of {len(full):,} messages (exit {code}); resumed:"
            f" {len(union) - len(head):,} more + {books} books at the cursor; union = (2)'s"
            f" delivery: {same}; trades twice: {twice}{listed(problems)}",
        )
    ]


def killed_child(
    command: Sequence[str], env: Mapping[str, str], after: int, timeout_s: float
) -> tuple[Delivered, str | None, int]:
    """Run `command` (`child_replay`), SIGKILL it once it printed `after` messages: the
    messages it printed (whole lines), its last printed cursor, its exit code."""
    child = subprocess.Popen(
        list(command),
        env=dict(env),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    guard = threading.Timer(timeout_s, child.kill)  # a child that hangs
    guard.start()
    lines = []
    for line in child.stdout:
        lines.append(line)
        if len(lines) >= after:
            child.send_signal(signal.SIGKILL)
            break
    child.wait()
    guard.cancel()
    lines += child.stdout.readlines()  # what it printed before it died
    head: Delivered = []
    cursor = None
    for entry in (json.loads(line) for line in lines if line.endswith("\n")):
        if "frames" in entry:
            topic, message = envelope.decode_sub([base64.b64decode(f) for f in entry["frames"]])
            assert isinstance(message, Tick | OHLC | BookSnapshot | BookDelta)
            head.append((topic, message))
            cursor = str(entry["cursor"])
    return head, cursor, int(child.returncode)


def resumed(head: Delivered, rest: Delivered) -> tuple[Delivered, int, list[str]]:
    """`head` and what a resume from its cursor delivered, as one delivery: each book topic
    the head reached restarts with the book at the cursor (one BookSnapshot, at the
    exchange sequence of the head's last change), left out. Returns the union, the
    books left out, and what is wrong (a resumed book that is not that, a trade or
    candle topic whose sequence does not go on 1..n)."""
    last_of = dict(head)
    problems = []
    books = 0
    kept: Delivered = []
    seen: set[str] = set()
    for topic, message in rest:
        first = topic not in seen
        seen.add(topic)
        if first and topic.endswith("|book") and topic in last_of:
            books += 1
            before = last_of[topic]
            if not isinstance(message, BookSnapshot) or not isinstance(
                before, BookSnapshot | BookDelta
            ):
                problems.append(f"{topic}: does not resume with the book at the cursor")
            elif message.exchange_sequence != before.exchange_sequence:
                problems.append(
                    f"{topic}: resumes at sequence {message.exchange_sequence}, the cursor's"
                    f" is {before.exchange_sequence}"
                )
            continue
        kept.append((topic, message))
    union = head + kept
    for topic, messages in by_topic(union).items():
        numbered = [m.sequence for m in messages] == list(range(1, len(messages) + 1))
        if not topic.endswith("|book") and not numbered:
            problems.append(f"{topic}: sequences not continued")
    return union, books, problems


def plain(got: Delivered) -> list[tuple[str, bytes]]:
    """The delivery without its sequence numbers (a resumed book topic's run one ahead:
    the book at the cursor counts)."""
    out = []
    for topic, message in got:
        copy = type(message)()
        copy.ParseFromString(message.SerializeToString())
        copy.sequence = 0
        out.append((topic, copy.SerializeToString(deterministic=True)))
    return out


# --- 4: into live -------------------------------------------------------------------------------


def into_live(client: Client, lake: RecordedLake, ticker: str, live_trades: int) -> list[Row]:
    follow = client.replay_into_live(ticker, "-2m", channels=["trades"])
    start_ms = follow.query.start_ms
    guard = threading.Timer(180, follow.close)  # a live feed that stopped
    guard.start()
    before: list[Tick] = []
    after: list[Tick] = []
    seam: ReplayComplete | None = None
    try:
        for message in follow:
            if isinstance(message, ReplayComplete):
                seam = message
                say(f"  the seam: {len(before):,} stored trades replayed; on into live")
            elif isinstance(message, Tick):
                (after if seam else before).append(message)
                if len(after) >= live_trades:
                    break
    except ReplaySeamTimeout as exc:  # the store never reached live: said, not skipped
        return [Row("4 replay into live", False, f"{len(before)} stored, then {exc}")]
    finally:
        guard.cancel()
        follow.close()
    delivered = before + after
    if seam is None or not after:
        return [
            Row(
                "4 replay into live",
                False,
                f"{len(before)} stored, seam {seam is not None}, {len(after)} after it",
            )
        ]
    last = delivered[-1]
    poll_until(
        "a trade stored after the last delivered",
        lambda: count(lake, contracts.ICEBERG_TICKS, ticker, last.timestamp_ms + 1),
        300,
        2.0,
    )
    rows = window(lake, contracts.ICEBERG_TICKS, ticker, start_ms, last.timestamp_ms + 1)
    got = [t.trade_id for t in delivered]
    # Trades in the last delivered one's millisecond but after it come later: left out.
    at_last = {t.trade_id for t in delivered if t.timestamp_ms == last.timestamp_ms}
    ordered = sorted(zip(micros(rows, Ticks.TRADE_TIME), column(rows, Ticks.TRADE_ID), strict=True))
    stored_ids = [i for us, i in ordered if us // 1000 < last.timestamp_ms or i in at_last]
    symbol = ticker.split(":", 1)[1]
    traded = MarketModel().iter_trades(symbol, start_ms, last.timestamp_ms)
    model = [str(t.id) for t in traded if t.time_ms < last.timestamp_ms or str(t.id) in at_last]
    ints = [int(i) for i in got]
    consecutive = all(b == a + 1 for a, b in itertools.pairwise(ints))
    numbered = [t.sequence for t in delivered] == list(range(1, len(delivered) + 1))
    ok = got == stored_ids == model and consecutive and numbered and len(set(got)) == len(got)
    at_ms = {trade_id: us // 1000 for us, trade_id in ordered}
    missing = [i for i in stored_ids if i not in set(got)]
    seam_ms = (before[-1].timestamp_ms if before else start_ms, after[0].timestamp_ms)
    lost = (
        f"; not delivered: {len(missing)} stored trades at {clock(at_ms[missing[0]])}"
        f"-{clock(at_ms[missing[-1]])}, between the last replayed ({clock(seam_ms[0])}) and"
        f" the first after the seam ({clock(seam_ms[1])})"
        if missing
        else ""
    )
    return [
        Row(
            f"4 {ticker} `replay_into_live` from -2m: no gap, no duplicate at the seam",
            ok,
            f"{len(before):,} stored + {len(after):,} after the seam (ids {got[0]}..{got[-1]},"
            f" {'consecutive' if consecutive else 'NOT consecutive'}); = market.ticks:"
            f" {got == stored_ids} ({len(stored_ids):,}); = the simulator's trades: {got == model}"
            f" ({len(model):,}; market.ticks = them: {stored_ids == model}); twice:"
            f" {len(got) - len(set(got))}; live duplicates dropped {follow.duplicates};"
            f" sequence 1..{len(delivered)}: {numbered}{lost}",
        )
    ]


# --- small things -------------------------------------------------------------------------------


def clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000))


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
