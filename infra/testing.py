"""Small helpers for tests and benchmarks against the local stack (no sleeps: poll with
deadlines)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from infra.localstack.config import free_ports

if TYPE_CHECKING:
    import pyarrow as pa
    import zmq
    from confluent_kafka import Consumer, Message
    from google.protobuf.message import Message as ProtoMessage

    from infra.exchange_sim.control import SimulatorControl
    from infra.localstack import StackEndpoints
    from infra.platform import Platform
    from mdclient import ClientSettings, HistoryResult
    from mdclient.book import BookStream
    from mdproto.messages import OHLC

_T = TypeVar("_T")


def free_port() -> int:
    """A loopback port free now, below the ephemeral range (`free_ports`: a server restarted
    on it by a test finds it still free)."""
    [port] = free_ports(1)
    return port


def poll_until(
    what: str,
    check: Callable[[], _T],
    timeout_s: float,
    interval_s: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> _T:
    """`check()` once it is truthy, polled: for state with nothing to block on (a browser
    page's); AssertionError naming `what` after `timeout_s`, with `detail()` (what was
    last seen) when given."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    seen = f": {detail()}" if detail is not None else ""
    raise AssertionError(f"{what} not within {timeout_s} s{seen}")


def in_ci() -> bool:
    """``CI`` is set to a true value (GitHub Actions, GitLab, .ci/run: ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the calling test for a missing tool or engine, with a warning; fail it under
    CI=true, where a missing one is a broken run, not a test to leave out unseen."""
    import pytest

    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


def run_ci_script(name: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run `infra/ci/<name>`, the installer of a system tool a test needs (chromium.sh,
    promtool.sh): its exit code and output; a failed install is for the test to judge."""
    from infra.localstack.config import REPO_ROOT

    script = REPO_ROOT / "infra" / "ci" / name
    return subprocess.run(
        [str(script)], capture_output=True, text=True, check=False, timeout=timeout_s
    )


def pipeline_env(
    endpoints: StackEndpoints,
    *,
    namespace: str,
    batches_topic: str,
    ticks_topic: str,
    checkpoint_dir: Path,
    pub_endpoint: str,
    ready_file: Path,
) -> dict[str, str]:
    """The environment of a `python -m pipeline` on the stack with its own namespace,
    topics, checkpoints and PUB: this process's, without its PIPELINE_* variables.
    Its closed live candles and its order books go to topics of its own next to
    `ticks_topic`."""
    from infra.artifacts import spark_jars

    e = endpoints
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        {
            "PYSPARK_PYTHON": sys.executable,
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": e.kafka_bootstrap,
            "PIPELINE_KAFKA__TOPIC_OHLC_BATCHES": batches_topic,
            "PIPELINE_KAFKA__TOPIC_TICKS": ticks_topic,
            "PIPELINE_KAFKA__TOPIC_LIVE_CANDLES": f"{ticks_topic}.live-candles",
            "PIPELINE_KAFKA__TOPIC_LIVE_CORRECTIONS": f"{ticks_topic}.corrections",
            "PIPELINE_KAFKA__TOPIC_BOOK": f"{ticks_topic}.book",
            **e.catalog_env("PIPELINE_CATALOG__"),
            "PIPELINE_CATALOG__NAMESPACE": namespace,
            "PIPELINE_SPARK__MASTER": "local[2]",
            "PIPELINE_SPARK__JARS": json.dumps([str(j) for j in spark_jars()]),
            "PIPELINE_CHECKPOINT_DIR": str(checkpoint_dir),
            "PIPELINE_PUB_ENDPOINT": pub_endpoint,
            "PIPELINE_READY_FILE": str(ready_file),
        }
    )
    return env


def consume(consumer: Consumer, count: int, timeout_s: float = 60.0) -> list[Message]:
    """Poll until ``count`` messages arrived; fail with the count seen after ``timeout_s``.

    Partition-EOF events are skipped; any other consumer error fails the test.
    """
    from confluent_kafka import KafkaError

    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)}/{count} messages within {timeout_s} s")
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(f"consumer error: {err}")
        got.append(msg)
    return got


def exchange_rows(symbol: str, start: int, end: int) -> list[tuple[float, ...]]:
    """The simulator's 1-minute candles for [start, end) as (open_ms, o, h, l, c, v)."""
    from infra.exchange_sim import expected_klines

    return [
        tuple(float(v) for v in k.ohlcv())
        for k in expected_klines(symbol, "1m", start, end)
        if k.open_time < end
    ]


#: (open, high, low, close, volume, trade count or None where the exchange reports none)
ExchangeCandle = tuple[float, float, float, float, float, int | None]


def exchange_candles(
    base_url: str, exchange_id: str, symbol: str, period_s: int, start_ms: int, end_ms: int
) -> dict[int, ExchangeCandle]:
    """The simulator's own candles opening in [start, end), read over one exchange
    front-end's REST API in that exchange's wire format: {open ms: ExchangeCandle}.

    Why over REST and not from the model: this is what the exchange says, the
    reference the live candles built by the pipeline must equal.
    """
    import urllib.parse
    import urllib.request

    market_id = symbol.replace("/", "")
    query: dict[str, str | int]
    if exchange_id == "binance":
        interval = {60: "1m", 300: "5m", 900: "15m", 3600: "1h"}[period_s]
        path, query = "/api/v3/klines", {"symbol": market_id, "interval": interval}
        query |= {"startTime": start_ms, "endTime": end_ms - 1, "limit": 1000}
    elif exchange_id == "bybit":
        path, query = "/v5/market/kline", {"category": "spot", "symbol": market_id}
        query |= {"interval": str(period_s // 60), "start": start_ms, "end": end_ms - 1}
        query["limit"] = 1000
    else:
        raise ValueError(f"no candle reader for {exchange_id!r}")
    url = f"{base_url.rstrip('/')}{path}?{urllib.parse.urlencode(query)}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        body = json.loads(response.read())
    rows = body if exchange_id == "binance" else body["result"]["list"]
    if len(rows) >= 1000:
        raise ValueError(f"{url}: a full page; ask for a shorter range")
    candles: dict[int, ExchangeCandle] = {}
    for r in rows:
        if start_ms <= int(r[0]) < end_ms:
            o, h, low, c, v = (float(x) for x in r[1:6])
            count = int(r[8]) if exchange_id == "binance" else None  # Bybit reports none
            candles[int(r[0])] = (o, h, low, c, v, count)
    return candles


def result_rows(result: HistoryResult) -> list[tuple[float, ...]]:
    """A history answer's rows in the same shape as `exchange_rows`."""
    return table_rows(result.table)


def table_rows(t: pa.Table) -> list[tuple[float, ...]]:
    """Candle frame rows (mdclient.frames) in the same shape as `exchange_rows`."""
    times = [int(ts.timestamp() * 1000) for ts in t.column("open_time").to_pylist()]
    columns = [t.column(name).to_pylist() for name in ("open", "high", "low", "close", "volume")]
    return [(float(ms), *values) for ms, *values in zip(times, *columns, strict=True)]


def notified_request_ids(sub: zmq.Socket[bytes], quiet_ms: int = 1000) -> list[str]:
    """The request_ids of the HistoryReadyNotifications queued on `sub`, read until it
    stays quiet for `quiet_ms`; closes the socket. Call it after a barrier request on
    the same topic, so any duplicate of an earlier notification is already queued."""
    from mdproto import envelope
    from mdproto.messages import HistoryReadyNotification

    seen: list[str] = []
    while sub.poll(timeout=quiet_ms):
        _, message = envelope.decode_sub(sub.recv_multipart())
        assert isinstance(message, HistoryReadyNotification)
        seen.append(message.request_id)
    sub.close(linger=0)
    return seen


@dataclass(frozen=True)
class Received:
    at: float  # time.time() when the SUB received it
    topic: str
    message: ProtoMessage


class Subscriber:
    """A SUB on a PUB (the pipeline's, the relay's) recording every message under `prefixes`
    (default: everything) on its own thread; tests and benchmarks wait on it with deadlines.

    Like any client it drops duplicates by sequence number (docs/protocol.md "Sequence
    numbers and recovery"): the last values the XPUB re-sends when another SUB
    subscribes; they are counted in `duplicates`.
    """

    def __init__(
        self,
        endpoint: str,
        prefixes: Sequence[bytes] = (b"",),
        *,
        wait_s: float = 240.0,
        bind: bool = False,
    ) -> None:
        """`bind`: publishers connect to it (as extra live engines connect to a relay)."""
        import zmq

        self.wait_s = wait_s  # wait_for's default deadline
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        for prefix in prefixes:
            self._socket.setsockopt(zmq.SUBSCRIBE, prefix)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.RCVTIMEO, 200)
        if bind:
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self._messages: list[Received] = []
        self._last: dict[str, tuple[int, int]] = {}  # topic -> (epoch, sequence)
        self.duplicates = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        from mdproto import envelope

        while not self._stop.is_set():
            try:
                frames = self._socket.recv_multipart()
            except zmq.Again:
                continue
            topic, message = envelope.decode_sub(frames)
            if self._duplicate(topic, message):
                continue
            with self._cond:
                self._messages.append(Received(time.time(), topic, message))
                self._cond.notify_all()

    def _duplicate(self, topic: str, message: ProtoMessage) -> bool:
        sequence = getattr(message, "sequence", 0)
        if not sequence:
            return False
        epoch = message.publisher_epoch  # type: ignore[attr-defined]
        last = self._last.get(topic)
        if last is not None and last[0] == epoch and sequence <= last[1]:
            self.duplicates += 1
            return True
        self._last[topic] = (epoch, sequence)
        return False

    @property
    def received(self) -> list[Received]:
        """Everything recorded so far, in arrival order."""
        with self._cond:
            return list(self._messages)

    def matching(self, predicate: Callable[[Received], bool]) -> list[Received]:
        with self._cond:
            return [m for m in self._messages if predicate(m)]

    def wait_for(
        self, predicate: Callable[[Received], bool], count: int = 1, timeout_s: float | None = None
    ) -> list[Received]:
        """The first `count` matching messages; AssertionError after the deadline."""
        timeout_s = self.wait_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [m for m in self._messages if predicate(m)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    topics = sorted({m.topic for m in self._messages})
                    raise AssertionError(
                        f"{len(found)}/{count} matching messages in {timeout_s} s; topics seen: "
                        f"{topics[:20]}"
                    )
                self._cond.wait(min(left, 1.0))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close(0)


#: The live tests' symbols trade in every minute, hundreds of times (the simulator's
#: ETH/USDT), so a feed's first trade comes well within a minute of its subscription.
#: Windows holding that first trade are incomplete by design (nothing before it was
#: seen: docs/protocol.md, "Live candles across a feed gap"), so only windows
#: opening after that minute were seen whole.
FIRST_TRADE_WITHIN_MS = 60_000


@dataclass(frozen=True)
class LiveRun:
    """What `closed_live_candles` saw: simulator times and the closed candles."""

    exchange_url: str
    subscribed_ms: int  # sim time once the stream was subscribed
    reached_ms: int  # sim time at the end of the run
    closed: dict[tuple[int, int], OHLC]  # (period s, open ms) -> first closed candle
    corrections: list[OHLC]


def closed_live_candles(
    client_settings: ClientSettings,
    sim: SimulatorControl,
    ticker: str,
    periods: Sequence[int],
    *,
    speedup: float = 200.0,
    settle_s: float = 360.0,
) -> LiveRun:
    """Subscribe to `ticker`'s live candles and run the simulator's clock `speedup` times
    faster than the wall until a whole window of the longest period has passed.

    Why a fast clock: a closed 1 h candle would otherwise take up to two hours. The
    simulator streams its model trades as its clock passes them, in order, so the
    ingestor and the pipeline see the same trades as at normal speed, only denser.
    Windows opening a minute after the subscription (`FIRST_TRADE_WITHIN_MS`) and
    ending a minute before the time reached were seen whole; the wait for them to
    close lasts up to `settle_s` (generous: the first micro-batches of a just-started
    pipeline on loaded cores took minutes; it ends as soon as they are all in).
    """
    from mdclient import Client
    from mdproto.messages import OHLC

    symbol = ticker.split(":", 1)[1]
    longest_ms = max(periods) * 1000
    closed: dict[tuple[int, int], OHLC] = {}
    corrections: list[OHLC] = []

    def take(message: object) -> None:
        if isinstance(message, OHLC) and message.closed:
            key = (message.period_seconds, message.open_time_ms)
            if message.correction:
                corrections.append(message)
            else:
                closed.setdefault(key, message)

    with (
        Client(settings=client_settings) as client,
        client.live(ticker, ticks=False, ohlc=list(periods)) as stream,
    ):
        sim.wait_for_subscribers(symbol, count=1, timeout_s=120)
        subscribed = sim.now_ms()  # the stream carries every model trade from here on
        feed_from = subscribed + FIRST_TRADE_WITHIN_MS
        first = feed_from - feed_from % longest_ms + longest_ms  # first whole window
        target = first + longest_ms + 60_000  # trades of a later minute close the last window
        wall = time.monotonic()
        while (now := sim.now_ms()) < target:
            deadline = time.monotonic() + 0.1
            while (left := deadline - time.monotonic()) > 0:  # read while time runs
                take(stream.get(timeout_s=left))
            elapsed_ms = (time.monotonic() - wall) * 1000
            wall = time.monotonic()
            sim.advance_time(min(int(elapsed_ms * (speedup - 1)), target - now))
        expected = {
            (p, t)
            for p in periods
            for t in range(feed_from - feed_from % (p * 1000) + p * 1000, target, p * 1000)
            if t + p * 1000 <= target - 60_000
        }
        deadline = time.monotonic() + settle_s
        # A window nobody traded in never closes: use a symbol that trades every minute.
        while not expected <= closed.keys() and time.monotonic() < deadline:
            take(stream.get(timeout_s=max(0.0, deadline - time.monotonic())))
    return LiveRun(sim.base_url, subscribed, target, closed, corrections)


def assert_live_equals_exchange(run: LiveRun, exchange_id: str, symbol: str, period: int) -> None:
    """Each closed live candle of `period` whose window the subscription saw whole
    equals the exchange's own candle for that window (read over its REST API)."""
    period_ms = period * 1000
    feed_from = run.subscribed_ms + FIRST_TRADE_WITHIN_MS
    start = feed_from - feed_from % period_ms + period_ms
    reached = run.reached_ms
    exchange = exchange_candles(run.exchange_url, exchange_id, symbol, period, start, reached)
    exchange = {t: c for t, c in exchange.items() if t + period_ms <= reached - 60_000}
    seen_whole = range(start, reached - 60_000 - period_ms + 1)
    live = {t: c for (p, t), c in run.closed.items() if p == period and t in seen_whole}
    assert exchange, f"the exchange served no {period} s candle in [{start}, {reached})"
    assert run.closed, "no closed live candle arrived at all: the pipeline closed nothing in time"
    missing = sorted(exchange.keys() - live.keys())
    assert not missing, f"{len(missing)} of {len(exchange)} windows never closed live: {missing}"
    extra = sorted(live.keys() - exchange.keys())
    assert not extra, f"live candles for windows the exchange has none of: {extra}"
    for open_ms, (o, h, low, c, volume, count) in exchange.items():
        candle = live[open_ms]
        assert (candle.open, candle.high, candle.low, candle.close) == (o, h, low, c), open_ms
        # A float sum of the trades' amounts vs the exchange's decimal total.
        assert abs(candle.volume - volume) <= 1e-9 * volume, (open_ms, candle.volume, volume)
        if count is not None:  # where the exchange reports a trade count
            assert candle.trade_count == count, open_ms
        # Built from trades: what only the exchange reports stays unset live.
        assert not candle.HasField("quote_volume") and not candle.HasField("taker_buy_volume")
        assert not candle.incomplete, f"{open_ms}: seen whole, yet marked incomplete"
    late = [m for m in run.corrections if m.period_seconds == period]
    assert not late, f"{len(late)} closed candle(s) amended by late trades"


def book_equals_exchange(
    book: BookStream, sim: SimulatorControl, symbol: str
) -> Callable[[], bool]:
    """A check for `poll_until`: the client's whole book equals the exchange's at the
    update the client's book is at (books move every 100 ms: compare like with like).
    That update is the exchange's id where it sends one (Binance `u`, OKX `seqId`,
    Bybit `seq`: the simulator's step), else the step of its time (Kraken, Coinbase)."""
    from infra.exchange_sim.books import step_of

    def levels(side: list[list[str]]) -> list[tuple[float, float]]:
        return [(float(price), float(amount)) for price, amount in side]

    def check() -> bool:
        if not book.in_sync:
            return False
        mine = book.snapshot()
        step = mine.exchange_sequence or step_of(mine.exchange_time_ms)
        exchange = sim.book(symbol, step)
        return mine.bids.top() == levels(exchange["bids"]) and mine.asks.top() == levels(
            exchange["asks"]
        )

    return check


#: What the e2e platforms record: markets no other e2e test injects trades into or
#: watches stop (make run and a user's compose stack record BTC, ETH and SOL).
E2E_RECORDED = ("LINK/USDT", "DOT/USDT", "LTC/USDT")
#: A relay cancels a live feed this long after its last subscriber left, on both e2e
#: platforms (infra/compose/e2e.yml says the same): the tests that watch a feed stop
#: wait that long, and a user's 30 s would only make them slower.
E2E_REALTIME_GRACE_S = "5"


@contextmanager
def own_platform(
    data_dir: Path, exchanges: Sequence[str], service_env: Mapping[str, str] | None = None
) -> Iterator[Platform]:
    """A whole local platform on free ports serving `exchanges` from the simulator
    (for a test module that must not share the session's platform); `service_env`:
    extra service settings, e.g. small ingestor pages."""
    from infra.localstack import Ports, StackConfig
    from infra.platform import Platform, PlatformConfig, ServicePorts

    config = PlatformConfig(
        data_dir=data_dir,
        ports=ServicePorts.free(),
        exchanges=list(exchanges),
        start_timeout_s=600.0,  # Spark alone took 300 s at load ~100 (two cores shared)
        service_env=dict(service_env or {}),
        record=[],  # its tests watch feeds start and stop with their subscriptions
    )
    stack_config = StackConfig(data_dir=data_dir, ports=Ports.free())
    with Platform(config, stack_config=stack_config, use_simulator=True) as running:
        yield running


def platform_client(platform: Platform, **overrides: object) -> ClientSettings:
    """Client settings for `platform` (its endpoints), with `overrides` on top."""
    from mdclient import ClientSettings

    env = platform.endpoints.client_env()
    fields = {key.removeprefix("MDCLIENT_").lower(): value for key, value in env.items()}
    return ClientSettings.model_validate({**fields, **overrides})


@dataclass(frozen=True)
class CommitRace:
    """What `race_commits` saw: the property keys each table holds, the conflicts the
    writers met, and whether an append on stale metadata was refused."""

    expected: dict[str, set[str]]
    landed: dict[str, set[str]]
    conflicts: int  # how many depends on timing: the catalog retries property commits
    stale_refused: bool


def race_commits(
    catalog_properties: Mapping[str, str], writers: int = 8, commits: int = 50
) -> CommitRace:
    """`writers` threads x `commits` catalog commits, odd writers on one shared table.

    Each commit adds one table property, so a lost commit is a missing key. A
    conflict is answered 409 (CommitFailedException) and retried on fresh
    metadata, as Iceberg's own retry does in Spark; anything else (a 500, as the
    old SQLite catalog's SQLITE_BUSY) propagates and fails the caller. Property
    commits keep it fast: the catalog does the same compare-and-swap as for an
    append, and only the catalog writes files.
    """
    import threading
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import CommitFailedException

    def connect(name: str) -> Any:
        return load_catalog(name, **catalog_properties)

    catalog = connect("race")
    namespace = f"race_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    schema = pa.schema([pa.field("id", pa.int64())])
    table_of = {
        w: f"{namespace}.shared" if w % 2 else f"{namespace}.own_{w}" for w in range(writers)
    }
    expected: dict[str, set[str]] = {}
    for w, name in table_of.items():
        expected.setdefault(name, set()).update(f"test.w{w}.c{i}" for i in range(commits))
    for name in expected:
        catalog.create_table(name, schema=schema)

    # Every writer's first commit starts from the same metadata: on a quiet machine
    # the loops alone may never overlap, and the shared table would see no contention.
    all_loaded = threading.Barrier(writers)

    def write(w: int) -> int:
        own = connect(f"w{w}")
        conflicts = 0
        for i in range(commits):
            while True:
                try:
                    with own.load_table(table_of[w]).transaction() as tx:
                        tx.set_properties({f"test.w{w}.c{i}": "1"})
                        if i == 0 and conflicts == 0:
                            all_loaded.wait(timeout=60)
                    break
                except CommitFailedException:
                    conflicts += 1
        return conflicts

    with ThreadPoolExecutor(max_workers=writers) as pool:
        conflicts = sum(pool.map(write, range(writers)))
    landed = {
        name: {k for k in catalog.load_table(name).properties if k.startswith("test.")}
        for name in expected
    }
    # A conflict for certain: the catalog applies a property commit on fresh metadata
    # by itself, so whether the writers above met a 409 depends on timing (CI saw none).
    # An append made from metadata another append has moved on must be refused (409,
    # CommitFailedException), neither applied nor a 500. (pyiceberg would retry it on
    # fresh metadata: not here, so the refusal is seen.)
    rows = pa.table({"id": [1]}, schema=schema)
    with catalog.load_table(f"{namespace}.shared").transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "0"})
    catalog.load_table(f"{namespace}.shared").append(rows)  # the base both start from
    first, stale = (catalog.load_table(f"{namespace}.shared") for _ in range(2))
    first.append(rows)
    try:
        stale.append(rows)
        stale_refused = False
    except CommitFailedException:
        stale_refused = True
    return CommitRace(expected, landed, conflicts, stale_refused)


class RecordedLake:
    """The Iceberg tables a recording fills, read as a client would (pyiceberg)."""

    def __init__(self, catalog_name: str, properties: Mapping[str, str], tickers: Sequence[str]):
        from pyiceberg.catalog import load_catalog

        self._catalog = load_catalog(catalog_name, **properties)
        self.tickers = list(tickers)
        self._quoted = "(" + ", ".join(f"'{t}'" for t in self.tickers) + ")"

    def rows(self, name: str, row_filter: str) -> pa.Table | None:
        """The rows of table `name` matching `row_filter`; None while it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self._catalog.load_table(name)
        except NoSuchTableError:
            return None
        return table.scan(row_filter=row_filter).to_arrow()

    def ticks(self, since_ms: int = 0) -> list[dict[str, Any]]:
        from mdproto import contracts
        from mdproto.tables import Ticks

        rows = self.rows(
            contracts.ICEBERG_TICKS,
            f"{Ticks.TICKER} IN {self._quoted} AND {Ticks.TRADE_TIME} >= '{iso_ms(since_ms)}'",
        )
        return [] if rows is None else rows.to_pylist()

    def trades(self, trade_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The stored rows of these trade ids, at any time (where a missing trade went)."""
        from mdproto import contracts
        from mdproto.tables import Ticks

        if not trade_ids:
            return []
        ids = ", ".join(f"'{i}'" for i in trade_ids)
        where = f"{Ticks.TICKER} IN {self._quoted} AND {Ticks.TRADE_ID} IN ({ids})"
        rows = self.rows(contracts.ICEBERG_TICKS, where)
        return [] if rows is None else rows.to_pylist()

    def newest_ms(self, since_ms: int = 0) -> dict[str, int]:
        """Each ticker's newest stored trade time (tickers with none are left out)."""
        from mdproto.tables import Ticks

        newest: dict[str, int] = {}
        for row in self.ticks(since_ms):
            ms = epoch_ms(row[Ticks.TRADE_TIME])
            newest[row[Ticks.TICKER]] = max(ms, newest.get(row[Ticks.TICKER], 0))
        return newest

    def gaps(self, detected_since_ms: int = 0) -> list[dict[str, Any]]:
        from mdproto import contracts
        from mdproto.tables import Gaps

        rows = self.rows(contracts.ICEBERG_GAPS, f"{Gaps.TICKER} IN {self._quoted}")
        found = [] if rows is None else rows.to_pylist()
        return [g for g in found if epoch_ms(g[Gaps.DETECTED_AT]) >= detected_since_ms]

    def candles_over(self, ticker: str, period_s: int, from_ms: int, to_ms: int) -> tuple[int, int]:
        """(stored, incomplete): `ticker`'s stored candles whose window meets [from, to]."""
        from mdproto import contracts
        from mdproto.tables import Ohlc

        start = from_ms // (period_s * 1000) * period_s * 1000
        rows = self.rows(
            contracts.ICEBERG_OHLC,
            f"{Ohlc.TICKER} = '{ticker}' AND {Ohlc.PERIOD_SECONDS} = {period_s}"
            f" AND {Ohlc.OPEN_TIME} >= '{iso_ms(start)}' AND {Ohlc.OPEN_TIME} <= '{iso_ms(to_ms)}'",
        )
        found = rows.to_pylist() if rows is not None else []
        return len(found), sum(1 for r in found if r[Ohlc.INCOMPLETE])


@dataclass(frozen=True)
class RecordingCheck:
    """One market's stored trades against the simulator's over a window."""

    ticker: str
    traded: int
    stored: int
    missing: list[str]  # model trade ids not stored (outside unrepairable gaps)
    unrepairable: int  # model trades inside gaps the platform reported unrepairable
    extra: list[str]  # stored ids the model does not have, or stored twice, or wrong values

    @property
    def ok(self) -> bool:
        return not self.missing and not self.extra


def check_recording(
    ticks: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    ticker: str,
    model_trades: Sequence[Any],
    begin_ms: int,
    end_ms: int,
) -> RecordingCheck:
    """Stored trades of `ticker` in [begin, end] against the model's, trade for trade
    (id, price, amount, time); trades inside an UNREPAIRABLE gap may be missing."""
    from mdproto.tables import Gaps, Ticks

    lost = [
        (int(g[Gaps.FROM_TRADE_ID]), int(g[Gaps.TO_TRADE_ID]))
        for g in gaps
        if g[Gaps.TICKER] == ticker and g[Gaps.STATUS] == "UNREPAIRABLE"
    ]
    want = {
        str(t.id): (float(t.price), float(t.qty), t.time_ms)
        for t in model_trades
        if begin_ms <= t.time_ms <= end_ms
    }
    got: dict[str, tuple[float, float, int]] = {}
    extra: list[str] = []
    for row in ticks:
        ms = epoch_ms(row[Ticks.TRADE_TIME])
        if row[Ticks.TICKER] != ticker or not begin_ms <= ms <= end_ms:
            continue
        trade_id = row[Ticks.TRADE_ID]
        value = (row[Ticks.PRICE], row[Ticks.AMOUNT], ms)
        if trade_id in got or want.get(trade_id) != value:
            extra.append(trade_id)
        got[trade_id] = value
    in_lost = {i for i in want if any(a < int(i) < b for a, b in lost)}
    missing = sorted(set(want) - set(got) - in_lost)
    return RecordingCheck(ticker, len(want), len(got), missing, len(in_lost - set(got)), extra)


def iso_ms(ms: float) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


def epoch_ms(value: datetime.datetime) -> int:
    """A timestamptz as read back from Iceberg (a datetime) in epoch milliseconds."""
    return round(value.timestamp() * 1000)
