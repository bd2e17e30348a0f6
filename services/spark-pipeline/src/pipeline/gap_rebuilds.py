"""REPAIRED gaps: their live candles rebuilt from ``ticks`` (a driver thread, Spark jobs).

Why: the live engine built a recorded market's candles over a gap without the trades
the feed missed (and marked them incomplete); the ingestor has since fetched those
trades (``Tick.repaired``) into ``market.ticks``, which now holds them all.

    gaps query: a REPAIRED gap -> pending (a JSON object under checkpoint_dir, local or
    S3: a restart keeps it) -> this thread, every gaps.retry_s while anything is pending:
      probe ``ticks`` (one Spark aggregate for every pending gap: to_trade_id stored?
        trades inside, counted as the repair counts them? newest stored trade; asked
        again only once ``ticks`` has a new snapshot)
      -> `next_step` (pure, per gap): wait, give up, or rebuild what settled
      -> candles of every gap's settled windows (one Spark job: min_by/max_by by trade
         order, on executors)
      -> ``ohlc`` by `Lake.write_live` (source live, incomplete false; history rows win)
      -> the recent ones as corrections to ``publish`` (`corrections.CorrectionsProducer`:
         the ticker's live engine publishes them on ``{ticker}|ohlc:{period}``)

Ordering. The ingestor writes REPAIRED once its repaired ticks are in Kafka, but
ticks-persist commits them up to ``live.persist_trigger_s`` later (more after a
restart): a gap is rebuilt only once ``ticks`` holds its ``to_trade_id`` and at least
``trades_recovered`` trades inside it, counted as the repair counts them
(`stored_inside`); until then it is retried, and given up after ``gaps.ticks_wait_s``
(a warning and a metric).

Settling. A window at an edge of the gap also holds trades recorded live before or
after it. It is rebuilt once settled: a stored trade of its ticker lies
``live.watermark_s`` past its end (the live engine closed it and amends it no more,
and ticks-persist stored what came before), or ``gaps.settle_s`` passed since its end
(a quiet market). Earlier, the live engine could still close or amend it (without the
repaired trades, incomplete) over the rebuilt row. Its closed candle of the window may
still reach ``ohlc`` after the rebuild (candles-store behind, e.g. through a catalog
outage): it counts fewer trades, and the live merge (`candle_merges.live_merge`, or
`lake.merge_live_candles` on Spark) keeps the fuller row.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import Message

from mdproto import gaps as gap_rules
from mdproto import topics
from mdproto.messages import OHLC
from mdproto.tables import Ohlc
from pipeline import records
from pipeline.blobs import Blob, Folder
from pipeline.config import Settings
from pipeline.gaps import Gap
from pipeline.lake import Lake
from pipeline.live import live_ohlc_rows
from pipeline.session import BACKGROUND_POOL, JVM_GONE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from pipeline.metrics import GapMetrics

log = logging.getLogger(__name__)

Window = tuple[int, int]  # (period s, open time ms)
Publish = Callable[[Iterable[tuple[str, Message]]], int]
PENDING_FORMAT = 1


# -- the rules (pure) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rules:
    """The knobs, from the ``live`` and ``gaps`` sections."""

    periods: tuple[int, ...]
    lateness_ms: int
    settle_ms: int
    ticks_wait_ms: int
    correction_ms: int

    @classmethod
    def of(cls, settings: Settings) -> Rules:
        g = settings.gaps
        return cls(
            tuple(settings.live.periods),
            round(settings.live.watermark_s * 1000),
            round(g.settle_s * 1000),
            round(g.ticks_wait_s * 1000),
            round(g.correction_s * 1000),
        )


@dataclass(frozen=True, slots=True)
class Probe:
    """What ``ticks`` holds of a gap's ticker from the gap's start on."""

    has_to: bool  # the gap's to_trade_id
    by_order: int  # trades strictly between its ends in trade order (time, id length, id)
    by_time: int  # trades of [from_time, to_time] but the two ends
    frontier_ms: int | None  # the newest trade time (up to the last window's horizon)


@dataclass
class Pending:
    """A REPAIRED gap waiting for (the rest of) its rebuild."""

    gap: Gap
    deadline_ms: int  # given up if its trades are not all stored by then
    done: set[Window] = field(default_factory=set)
    deferrals: int = 0


@dataclass(frozen=True, slots=True)
class Step:
    """What to do with a pending gap now."""

    windows: tuple[Window, ...] = ()  # rebuild these now
    finished: bool = False  # nothing left after them
    deferred: bool = False  # its trades are not all stored yet
    gave_up: str = ""  # why it is dropped, unrebuilt


def gap_windows(gap: Gap, periods: Sequence[int]) -> list[Window]:
    """Every window of every period that overlaps [from_time, to_time] (both ends in)."""
    out = []
    for period in periods:
        width = period * 1000
        first = gap.from_time_ms - gap.from_time_ms % width
        out += [(period, start) for start in range(first, gap.to_time_ms + 1, width)]
    return out


def window_end_ms(window: Window) -> int:
    period, start = window
    return start + period * 1000


def counted_by_id(gap: Gap) -> bool:
    """How the repair counted ``trades_recovered`` (`mdproto.gaps.counted_by_id`)."""
    return gap_rules.counted_by_id(gap.from_trade_id, gap.to_trade_id, gap.trades_recovered)


def stored_inside(gap: Gap, probe: Probe) -> int:
    """The stored trades of the gap, counted as the repair counted. By id, the count in
    trade order: it is the ids between the ends, without the live trades that share an
    end's millisecond (counted by time, they could stand in for repaired trades not
    stored yet)."""
    return probe.by_order if counted_by_id(gap) else probe.by_time


def ticks_complete(gap: Gap, probe: Probe) -> bool:
    """The rebuild's readiness: ``ticks`` holds the trade after the gap and at least as
    many trades inside it as the repair recovered."""
    return probe.has_to and stored_inside(gap, probe) >= gap.trades_recovered


def settled(window: Window, probe: Probe, now_ms: int, rules: Rules) -> bool:
    """The live engine is done with the window and its trades are stored (module doc)."""
    end = window_end_ms(window)
    stored_past = probe.frontier_ms is not None and probe.frontier_ms >= end + rules.lateness_ms
    return stored_past or now_ms >= end + rules.settle_ms


def next_step(pending: Pending, probe: Probe, now_ms: int, rules: Rules) -> Step:
    gap = pending.gap
    if not ticks_complete(gap, probe):
        if now_ms >= pending.deadline_ms:
            stored = f"{stored_inside(gap, probe)} of {gap.trades_recovered} recovered trades"
            to = "" if probe.has_to else f", not to_trade_id {gap.to_trade_id}"
            return Step(gave_up=f"ticks hold {stored}{to}")
        return Step(deferred=True)
    todo = [w for w in gap_windows(gap, rules.periods) if w not in pending.done]
    due = tuple(w for w in todo if settled(w, probe, now_ms, rules))
    return Step(windows=due, finished=len(due) == len(todo))


def horizon_ms(gap: Gap, rules: Rules) -> int:
    """The latest trade time a probe needs: the last window's end plus the lateness."""
    return max(map(window_end_ms, gap_windows(gap, rules.periods))) + rules.lateness_ms


def candle_rows(candles: pa.Table) -> pa.Table:
    """Spark's aggregates (`rebuilt_candles`) -> ``live_ohlc_rows``' input: the first
    eleven ``ohlc`` columns and ``incomplete`` false (every trade is in ``ticks``)."""
    schema = records.OHLC_SCHEMA
    columns = {
        name: candles[name].cast(schema.field(name).type)
        for name in schema.names[:11]
        if name != Ohlc.OPEN_TIME
    }
    columns[Ohlc.OPEN_TIME] = candles["open_time_us"].cast(pa.int64()).cast(records.UTC_US)
    columns["incomplete"] = pa.array([False] * candles.num_rows, pa.bool_())
    return pa.table({name: columns[name] for name in [*schema.names[:11], "incomplete"]})


def corrections(rows: pa.Table, now_ms: int, within_ms: int) -> list[tuple[str, OHLC]]:
    """The rebuilt candles (`candle_rows`) that ended within ``within_ms`` of now, as the
    corrections the live engine would publish: subscribers may still hold them."""
    if within_ms <= 0 or rows.num_rows == 0:
        return []
    open_ms = pc.divide(rows[Ohlc.OPEN_TIME].cast(pa.int64()), 1000).to_pylist()
    out = []
    for row, start in zip(rows.to_pylist(), open_ms, strict=True):
        period = row[Ohlc.PERIOD_SECONDS]
        if start + period * 1000 < now_ms - within_ms:
            continue
        message = OHLC(
            ticker=row[Ohlc.TICKER],
            period_seconds=period,
            open_time_ms=start,
            open=row[Ohlc.OPEN],
            high=row[Ohlc.HIGH],
            low=row[Ohlc.LOW],
            close=row[Ohlc.CLOSE],
            volume=row[Ohlc.VOLUME],
            trade_count=row[Ohlc.TRADE_COUNT],
            closed=True,
            correction=True,
            incomplete=False,
        )
        out.append((topics.ohlc_topic(message.ticker, period), message))
    return out


# -- the pending file ----------------------------------------------------------------------


class PendingFile:
    """The pending gaps and their rebuilt windows, one JSON object replaced whole (beside
    the checkpoints, local or in the S3 store): a REPAIRED record is read once by the
    gaps query, so its rebuild must outlive a restart, on this host or another."""

    def __init__(self, target: Path | Blob) -> None:
        self.blob = target if isinstance(target, Blob) else Blob.local(target)

    @classmethod
    def for_settings(cls, settings: Settings) -> PendingFile:
        folder = Folder.at(settings.checkpoint_for("gap-rebuilds"), settings.catalog)
        return cls(folder.child("pending.json"))

    def load(self) -> list[tuple[Gap, set[Window]]]:
        raw = self.blob.read()
        if raw is None:
            return []
        data = json.loads(raw)
        if data.get("format") != PENDING_FORMAT:
            log.warning("%s: format %s is not ours: ignored", self.blob, data.get("format"))
            return []
        return [
            (Gap(**entry["gap"]), {(int(p), int(s)) for p, s in entry["done"]})
            for entry in data["gaps"]
        ]

    def save(self, pending: Iterable[Pending]) -> None:
        body = {
            "format": PENDING_FORMAT,
            "gaps": [{"gap": dataclasses.asdict(p.gap), "done": sorted(p.done)} for p in pending],
        }
        self.blob.write(json.dumps(body, separators=(",", ":")).encode())


# -- Spark (the adapters) -------------------------------------------------------------------


def _trade_order() -> list[Column]:
    """A trade's place in trade order: (time, length of id, id), as candle_close.TradeKey."""
    from pyspark.sql import functions as sf

    return [sf.unix_micros("trade_time"), sf.length("trade_id"), sf.col("trade_id")]


def _beyond(columns: Sequence[Column], values: Sequence[Any], op: Any) -> Column:
    """Lexicographic ``columns op values`` (op: operator.gt or operator.lt)."""
    from pyspark.sql import functions as sf

    column, value = columns[0], sf.lit(values[0])
    first: Column = op(column, value)
    if len(columns) == 1:
        return first
    return first | ((column == value) & _beyond(columns[1:], values[1:], op))


def _timestamp(ms: int) -> Column:
    from pyspark.sql import functions as sf

    return sf.timestamp_micros(sf.lit(ms * 1000))


def _ticks(session: SparkSession, table: str, ticker: str, lo_ms: int, hi_ms: int) -> DataFrame:
    """The ticker's trades in [lo_ms, hi_ms] (pruned to its partitions)."""
    from pyspark.sql import functions as sf

    t = sf.col("trade_time")
    return session.table(table).where(
        (sf.col("ticker") == sf.lit(ticker)) & (t >= _timestamp(lo_ms)) & (t <= _timestamp(hi_ms))
    )


def probe_ticks(
    session: SparkSession, table: str, gaps: Sequence[tuple[Gap, int]]
) -> dict[str, Probe]:
    """`Probe` of every gap from its first trade to its ``until_ms``: one aggregate (one
    Spark job) for them all, keyed by gap id; a gap with no stored trade probes empty."""
    from pyspark.sql import functions as sf

    order = _trade_order()
    frames = []
    for gap, until_ms in gaps:
        after_from = (gap.from_time_ms * 1000, len(gap.from_trade_id), gap.from_trade_id)
        before_to = (gap.to_time_ms * 1000, len(gap.to_trade_id), gap.to_trade_id)
        between = _beyond(order, after_from, operator.gt) & _beyond(order, before_to, operator.lt)
        ends = sf.col("trade_id").isin(gap.from_trade_id, gap.to_trade_id)
        frames.append(
            _ticks(session, table, gap.ticker, gap.from_time_ms, until_ms).select(
                sf.lit(gap.gap_id).alias("gap_id"),
                (sf.col("trade_id") == sf.lit(gap.to_trade_id)).alias("is_to"),
                between.alias("between"),
                ((sf.col("trade_time") <= _timestamp(gap.to_time_ms)) & ~ends).alias("in_range"),
                sf.unix_millis("trade_time").alias("ms"),
            )
        )
    rows = (
        functools.reduce(lambda a, b: a.unionByName(b), frames)
        .groupBy("gap_id")
        .agg(
            sf.bool_or("is_to").alias("has_to"),
            sf.count_if("between").alias("by_order"),
            sf.count_if("in_range").alias("by_time"),
            sf.max("ms").alias("frontier_ms"),
        )
        .toArrow()
        .to_pylist()
    )
    probes = {gap.gap_id: Probe(False, 0, 0, None) for gap, _ in gaps}
    for row in rows:
        frontier = row["frontier_ms"]
        probes[row["gap_id"]] = Probe(
            bool(row["has_to"]),
            int(row["by_order"]),
            int(row["by_time"]),
            None if frontier is None else int(frontier),
        )
    return probes


def rebuilt_candles(
    session: SparkSession, table: str, windows: Mapping[str, Iterable[Window]]
) -> pa.Table:
    """The candles of each ticker's ``windows`` from the stored trades, aggregated by Spark
    in one job (the few rows come back): open/close by trade order, high, low, volume
    sum, trade count. A window asked twice (two gaps of one ticker) comes back once."""
    from pyspark.sql import functions as sf

    order = sf.struct(*_trade_order())
    micros = sf.unix_micros("trade_time")
    frames = []
    for ticker, asked in sorted(windows.items()):
        by_period: dict[int, set[int]] = {}
        for period, start in asked:
            by_period.setdefault(period, set()).add(start)
        for period, starts in sorted(by_period.items()):
            ticks = _ticks(session, table, ticker, min(starts), max(starts) + period * 1000 - 1)
            ticks = ticks.withColumn(
                "open_time_us", micros - sf.pmod(micros, sf.lit(period * 10**6))
            )
            ticks = ticks.where(sf.col("open_time_us").isin([s * 1000 for s in sorted(starts)]))
            frames.append(
                ticks.groupBy("ticker", "exchange", "symbol", "open_time_us").agg(
                    sf.lit(period).alias("period_seconds"),
                    sf.min_by("price", order).alias("open"),
                    sf.max("price").alias("high"),
                    sf.min("price").alias("low"),
                    sf.max_by("price", order).alias("close"),
                    sf.sum("amount").alias("volume"),
                    sf.count(sf.lit(1)).alias("trade_count"),
                )
            )
    return functools.reduce(lambda a, b: a.unionByName(b), frames).toArrow()


# -- the thread -----------------------------------------------------------------------------


#: What a probe asked: the ``ticks`` snapshot, and each gap's id and horizon.
ProbeQuestion = tuple[int, tuple[tuple[str, int], ...]]


class GapRebuilds:
    """The pending rebuilds and the thread that works them off; also recounts ``gaps`` by
    status for /metrics after each gaps batch. ``rebuild`` False (live path off: no live
    candles, no stored trades): statuses only."""

    def __init__(
        self,
        settings: Settings,
        spark: SparkSession,
        lake: Lake,
        *,
        publish: Publish | None = None,
        report: GapMetrics | None = None,
        rebuild: bool = True,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._spark = spark
        self._clock = clock or _now_ms  # epoch ms
        self._lake = lake
        self._publish = publish
        self._report = report
        self._rebuild = rebuild
        self._rules = Rules.of(settings)
        self._retry_s = settings.gaps.retry_s
        self._file = PendingFile.for_settings(settings) if rebuild else None
        self._pending: dict[str, Pending] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._recount = True
        self._thread: threading.Thread | None = None
        #: The last probe's question and its answer (`_probe`).
        self._probed: tuple[ProbeQuestion, dict[str, Probe]] | None = None

    def start(self) -> None:
        self.restore()
        self._thread = threading.Thread(target=self._loop, name="gap-rebuilds", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def restore(self) -> None:
        """The rebuilds pending when the pipeline stopped (their wait starts afresh: the
        restarted ticks-persist has its backlog to store first)."""
        if self._file is None:
            return
        deadline = self._clock() + self._rules.ticks_wait_ms
        for gap, done in self._file.load():
            self._pending[gap.gap_id] = Pending(gap, deadline, done)
        if self._pending:
            log.info("gap rebuilds: %d pending from before the start", len(self._pending))

    def merged(self, repaired: Sequence[Gap]) -> None:
        """A gaps batch committed: recount statuses, queue its REPAIRED gaps (a gap
        already pending keeps its progress)."""
        if repaired and self._file is not None:
            deadline = self._clock() + self._rules.ticks_wait_ms
            with self._lock:
                for gap in repaired:
                    self._pending.setdefault(gap.gap_id, Pending(gap, deadline))
                self._file.save(self._pending.values())
        self._recount = True
        self._wake.set()

    @property
    def pending(self) -> dict[str, Pending]:
        with self._lock:
            return dict(self._pending)

    def run_once(self) -> None:
        """One attempt at every pending gap: one probe of them all (none while ``ticks``
        has no new snapshot), then one rebuild of every window that settled (a Spark job
        and a merge a round, however many gaps)."""
        with self._lock:
            items = list(self._pending.values())
        now_ms, rules = self._clock(), self._rules
        probed = []
        for item in items:
            problem = item.gap.problem()
            if problem:
                self._finish(item, "gave_up", problem)
            else:
                probed.append(item)
        if not probed or self._stop.is_set():
            return
        probes = self._probe([(i.gap, horizon_ms(i.gap, rules)) for i in probed])
        due: list[tuple[Pending, Step]] = []
        for item in probed:
            probe = probes[item.gap.gap_id]
            step = next_step(item, probe, now_ms, rules)
            if step.gave_up:
                self._finish(item, "gave_up", step.gave_up)
            elif step.deferred:
                self._deferred(item, probe, now_ms)
            else:
                due.append((item, step))
        if self._stop.is_set():
            return
        self._write([(item.gap, step.windows) for item, step in due if step.windows], now_ms)
        # The round's progress saved once (the pending object may be in the S3 store).
        with self._lock:
            for item, step in due:
                item.done.update(step.windows)
                if step.finished:
                    self._pending.pop(item.gap.gap_id, None)
            self._save()
        for item, step in due:
            if step.finished:
                self._ended(item, "done", f"{len(item.done)} windows rebuilt")

    def _probe(self, asked: list[tuple[Gap, int]]) -> dict[str, Probe]:
        """`probe_ticks` of ``asked``, or the last round's answer to the same question if
        ``ticks`` has no new snapshot since: a pending gap waits on ticks-persist, whose
        commits come seconds apart, and each probe is a Spark job on the shared cores.
        (Spark may read a snapshot newer than the one named: then the next round asks.)"""
        table = self._lake.names.ticks
        key = (self._lake.snapshot_id(table), tuple((g.gap_id, h) for g, h in asked))
        if self._probed is None or self._probed[0] != key:
            self._probed = (key, probe_ticks(self._spark, table, asked))
        return self._probed[1]

    def _deferred(self, item: Pending, probe: Probe, now_ms: int) -> None:
        gap = item.gap
        item.deferrals += 1
        if self._report is not None:
            self._report.deferred()
        if item.deferrals == 1:
            log.info(
                "gap %s: ticks hold %d of %d recovered trades%s; rebuild waits for "
                "ticks-persist (gives up in %.0f s)",
                gap.gap_id,
                stored_inside(gap, probe),
                gap.trades_recovered,
                "" if probe.has_to else " and not its to_trade_id",
                (item.deadline_ms - now_ms) / 1000,
            )

    def _write(self, due: Sequence[tuple[Gap, Sequence[Window]]], now_ms: int) -> None:
        """The candles of every gap's settled windows, rebuilt and stored in one go."""
        if not due:
            return
        started = time.monotonic()
        windows: dict[str, set[Window]] = {}
        for gap, settled_windows in due:
            windows.setdefault(gap.ticker, set()).update(settled_windows)
        table = self._lake.names.ticks
        rows = candle_rows(rebuilt_candles(self._spark, table, windows))
        how = self._lake.write_live(self._spark, live_ohlc_rows(rows))
        published = corrections(rows, now_ms, self._rules.correction_ms)
        if published and self._publish is not None:
            self._publish(published)
        if self._report is not None:
            self._report.candles(rows.num_rows)
        log.info(
            "gaps %s: %d live candles rebuilt over %d windows (%s), %d corrections published "
            "in %.0f ms",
            ", ".join(gap.gap_id for gap, _ in due),
            rows.num_rows,
            sum(len(w) for w in windows.values()),
            how,
            len(published) if self._publish is not None else 0,
            (time.monotonic() - started) * 1000,
        )

    def _finish(self, item: Pending, outcome: str, detail: str) -> None:
        with self._lock:
            self._pending.pop(item.gap.gap_id, None)
            self._save()
        self._ended(item, outcome, detail)

    def _ended(self, item: Pending, outcome: str, detail: str) -> None:
        """Say and count how a gap's rebuild ended (it has left the pending set)."""
        if outcome == "done":
            log.info("gap %s: live candles rebuilt (%s)", item.gap.gap_id, detail)
        else:
            log.warning("gap %s: candle rebuild given up: %s", item.gap.gap_id, detail)
        if self._report is not None:
            self._report.rebuilt(outcome)

    def _save(self) -> None:
        """Under the lock."""
        if self._file is not None:
            self._file.save(self._pending.values())
        if self._report is not None:
            self._report.pending(len(self._pending))

    def _loop(self) -> None:
        # A pool of its own (per thread): the streaming queries' tasks are not queued behind it.
        self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", BACKGROUND_POOL)
        if self._report is not None:
            self._report.pending(len(self._pending))
        while not self._stop.is_set():
            try:
                if self._recount:
                    self._recount = False
                    if self._report is not None:
                        self._report.statuses(self._lake.gaps_by_status(self._spark))
                if self._rebuild:
                    self.run_once()
            except JVM_GONE as exc:  # stopping (or dead): the pending file keeps the gaps
                log.info("gap rebuilds: Spark's JVM has gone (%s); rebuilds stop", exc)
                return
            except Exception:  # the catalog or S3 away for a while: the next round retries
                log.exception("gap rebuilds: round failed; again in %g s", self._retry_s)
            self._wake.wait(self._retry_s if self._pending else None)
            self._wake.clear()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
