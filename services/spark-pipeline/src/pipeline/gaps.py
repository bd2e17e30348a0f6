"""Recorded markets' trade gaps: ``market.recording`` (Kafka, compacted) -> Iceberg ``gaps``.

    TradeGap records (key "gap:{gap_id}") -> gaps query (every gaps.trigger_s)
        -> decode on the driver -> newest state per gap_id -> MERGE by gap_id (newer
           updated_at wins) -> Iceberg ``gaps``: one row per gap
        -> REPAIRED gaps handed to `gap_rebuilds.GapRebuilds` (their live candles)

The topic also holds the ingestors' RecordingCheckpoint records (key = ticker): they
are filtered out by key in Spark, so only gap records reach the driver. Gap records
are few (a handful per market and day), so, like ``markets``, the query decodes on
the driver. While markets are recorded their checkpoints keep arriving, so a trigger
with no gap still runs a micro-batch (fetch and filter: 150-330 ms here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mdproto import ProtocolError, envelope
from mdproto.error_codes import BAD_ROW, BAD_TICKER, MISSING_ID
from mdproto.messages import TradeGap
from mdproto.tables import Gaps, arrow_schema
from pipeline import records
from pipeline.config import Settings
from pipeline.lake import Lake
from pipeline.session import BACKGROUND_POOL
from pipeline.streams import kafka_source, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipeline.gap_rebuilds import GapRebuilds

log = logging.getLogger(__name__)

QUERY_NAME = "gaps"
#: Kafka key prefix of TradeGap records in ``market.recording`` (docs/protocol.md).
KEY_PREFIX = "gap:"

#: Row layout of Iceberg ``market.gaps`` (mdproto.tables.Gaps).
GAPS_SCHEMA = arrow_schema(Gaps.SCHEMA)
_TIMES = {
    Gaps.FROM_TIME: "from_time_ms",
    Gaps.TO_TIME: "to_time_ms",
    Gaps.DETECTED_AT: "detected_at_ms",
    Gaps.UPDATED_AT: "updated_at_ms",
}


@dataclass(frozen=True, slots=True)
class Gap:
    """What a rebuild needs of a REPAIRED gap: plain data (the pending file holds it)."""

    gap_id: str
    ticker: str
    from_trade_id: str
    to_trade_id: str
    from_time_ms: int
    to_time_ms: int
    trades_recovered: int
    updated_at_ms: int

    @classmethod
    def of(cls, m: TradeGap) -> Gap:
        return cls(
            m.gap_id,
            m.ticker,
            m.from_trade_id,
            m.to_trade_id,
            m.from_time_ms,
            m.to_time_ms,
            m.trades_recovered,
            m.updated_at_ms,
        )

    def problem(self) -> str:
        """Why its candles cannot be rebuilt, or '' (a REPAIRED gap always has both ends)."""
        if not self.to_trade_id:
            return "no to_trade_id"
        if not 0 < self.from_time_ms <= self.to_time_ms <= records.MAX_TIME_MS:
            return f"times {self.from_time_ms}..{self.to_time_ms} are not a range"
        return ""


@dataclass(slots=True)
class GapBatch:
    """The newest state per gap_id in one micro-batch."""

    rows: pa.Table  # GAPS_SCHEMA, one row per gap_id
    latest: list[TradeGap] = field(default_factory=list)  # in the order of ``rows``
    rejects: list[records.Reject] = field(default_factory=list)

    @property
    def repaired(self) -> list[Gap]:
        return [Gap.of(m) for m in self.latest if m.state == TradeGap.REPAIRED]


def decode_gaps(kafka: pa.Table) -> GapBatch:
    """Kafka rows (value, partition, offset) of gap records -> the newest record per gap_id.

    Newest = the largest ``updated_at_ms``, the later record in Kafka order on a tie (a
    gap's records share a partition: key "gap:{gap_id}"). Across batches the MERGE
    compares ``updated_at``. A tombstone (compaction of a finished gap) is skipped.
    """
    partitions, offsets = records.kafka_coordinates(kafka)
    values: list[bytes | None] = kafka.column("value").to_pylist()
    latest: dict[str, TradeGap] = {}
    rejects: list[records.Reject] = []
    for value, partition, offset in zip(values, partitions, offsets, strict=True):
        if value is None:
            continue
        try:
            gap = envelope.decode_record(value, TradeGap)
        except ProtocolError as exc:
            rejects.append(records.Reject(partition, offset, exc.code, exc.reason))
            continue
        problem = gap_problem(gap)
        if problem:
            rejects.append(records.Reject(partition, offset, *problem))
            continue
        held = latest.get(gap.gap_id)
        if held is None or gap.updated_at_ms >= held.updated_at_ms:
            latest[gap.gap_id] = gap
    newest = list(latest.values())
    return GapBatch(rows=to_table(newest), latest=newest, rejects=rejects)


def gap_problem(gap: TradeGap) -> tuple[str, str] | None:
    """(error code, reason) if the record cannot be a row of ``gaps``."""
    if not gap.gap_id:
        return MISSING_ID, "TradeGap without gap_id"
    if records.split_ticker(gap.ticker) is None:
        return BAD_TICKER, f"ticker {gap.ticker!r} is not EXCHANGE:BASE/QUOTE"
    if gap.state == TradeGap.STATE_UNSPECIFIED:
        return BAD_ROW, f"gap {gap.gap_id!r} has no state"
    return None


def _name(enum: Any, value: int) -> str | None:
    """An enum value's name; None for 0 (unspecified); the number for one we do not know."""
    if value == 0:
        return None
    try:
        return str(enum.Name(value))
    except ValueError:
        return str(value)


def to_table(gaps: Sequence[TradeGap]) -> pa.Table:
    """TradeGap messages -> ``GAPS_SCHEMA`` rows; unknown times (0) are null."""
    exchange = [(records.split_ticker(g.ticker) or ("", ""))[0] for g in gaps]
    columns: dict[str, pa.Array] = {
        Gaps.GAP_ID: pa.array([g.gap_id for g in gaps], pa.string()),
        Gaps.TICKER: pa.array([g.ticker for g in gaps], pa.string()),
        Gaps.EXCHANGE: pa.array(exchange, pa.string()),
        Gaps.FROM_TRADE_ID: pa.array([g.from_trade_id for g in gaps], pa.string()),
        Gaps.TO_TRADE_ID: pa.array([g.to_trade_id for g in gaps], pa.string()),
        Gaps.CAUSE: pa.array([_name(TradeGap.Cause, g.cause) for g in gaps], pa.string()),
        Gaps.STATUS: pa.array([_name(TradeGap.State, g.state) for g in gaps], pa.string()),
        Gaps.REASON: pa.array([g.reason for g in gaps], pa.string()),
        Gaps.TRADES_RECOVERED: pa.array([g.trades_recovered for g in gaps], pa.int64()),
        Gaps.MISSING_IDS: pa.array([g.missing_ids for g in gaps], pa.int64()),
        Gaps.INGESTOR_ID: pa.array([g.ingestor_id for g in gaps], pa.string()),
    }
    for column, attribute in _TIMES.items():
        us = [getattr(g, attribute) * 1000 or None for g in gaps]
        columns[column] = pa.array(us, pa.int64()).cast(records.UTC_US)
    return pa.table({name: columns[name] for name in GAPS_SCHEMA.names}, schema=GAPS_SCHEMA)


class GapsWriter:
    """gaps: MERGE each micro-batch's newest gap states into ``gaps``, then hand the
    REPAIRED ones to the rebuilds (after the commit: a replay hands them again)."""

    def __init__(self, lake: Lake, rebuilds: GapRebuilds) -> None:
        self._lake = lake
        self._rebuilds = rebuilds

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as sf

        started = time.monotonic()
        gap_records = batch_df.where(sf.col("key").cast("string").startswith(KEY_PREFIX))
        batch = decode_gaps(gap_records.select("value", "partition", "offset").toArrow())
        records.log_rejects(f"gaps batch {batch_id}", batch.rejects)
        if batch.rows.num_rows == 0:
            return
        self._lake.merge_gaps(batch_df.sparkSession, batch.rows)
        repaired = batch.repaired
        self._rebuilds.merged(repaired)
        log.info(
            "gaps batch %d: %d gaps merged (%d REPAIRED) in %.0f ms",
            batch_id,
            batch.rows.num_rows,
            len(repaired),
            (time.monotonic() - started) * 1000,
        )


def start(
    spark: SparkSession, settings: Settings, lake: Lake, rebuilds: GapRebuilds
) -> StreamingQuery:
    g = settings.gaps
    return start_query(
        kafka_source(spark, settings, settings.kafka.topic_recording, g.max_offsets_per_trigger),
        name=QUERY_NAME,
        settings=settings,
        function=GapsWriter(lake, rebuilds),
        trigger_s=g.trigger_s,
        pool=BACKGROUND_POOL,  # bookkeeping: history and live candles first
    )
