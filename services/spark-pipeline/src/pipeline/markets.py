"""Market metadata: ``market.markets`` (Kafka, compacted) -> Iceberg ``markets``.

    Market records (key ticker) -> markets query (slow trigger) -> decode on the driver
        -> latest record per ticker -> MERGE by ticker (newer updated_at wins; a
           tombstone deletes) -> Iceberg ``markets``: one row per ticker

Markets change rarely (ingestors rewrite them at start and every few hours) and
an exchange lists a few thousand, so the query decodes on the driver: no Python
workers, no shuffle. It runs every ``markets.trigger_s`` (5 s): an idle trigger
only asks Kafka for offsets, and an ingestor's markets are stored within seconds
of its start, so that ``mdclient markets`` answers as soon as a platform is up
(it waited up to the 60 s trigger before, issue 45).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mdproto import ProtocolError
from mdproto.markets import decode_market_record
from mdproto.messages import Market
from mdproto.tables import Markets, arrow_schema
from pipeline import records
from pipeline.config import Settings
from pipeline.lake import Lake
from pipeline.session import BACKGROUND_POOL
from pipeline.streams import kafka_source, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

QUERY_NAME = "markets"

#: Row layout of Iceberg ``market.markets`` (mdproto.tables.Markets).
MARKETS_SCHEMA = arrow_schema(Markets.SCHEMA)
_COPIED = [n for n in MARKETS_SCHEMA.names if n not in (Markets.TICKER, Markets.UPDATED_AT)]


@dataclass(slots=True)
class MarketBatch:
    """The latest state per ticker in one micro-batch."""

    rows: pa.Table  # MARKETS_SCHEMA, one row per ticker still listed
    deleted: list[str] = field(default_factory=list)  # tickers whose last record is a tombstone
    rejects: list[records.Reject] = field(default_factory=list)


def decode_markets(kafka: pa.Table) -> MarketBatch:
    """Kafka rows (key, value, partition, offset) -> the last record per ticker.

    A ticker's records share a partition (key = ticker), so Kafka order is their
    order; across batches the MERGE compares ``updated_at``.
    """
    partitions, offsets = records.kafka_coordinates(kafka)
    keys: list[bytes | None] = kafka.column("key").to_pylist()
    values: list[bytes | None] = kafka.column("value").to_pylist()
    latest: dict[str, Market | None] = {}
    rejects: list[records.Reject] = []
    for key, value, partition, offset in zip(keys, values, partitions, offsets, strict=True):
        try:
            ticker, market = decode_market_record(key, value)
        except ProtocolError as exc:
            rejects.append(records.Reject(partition, offset, exc.code, exc.reason))
            continue
        latest.pop(ticker, None)  # re-insert: dict order = order of last records
        latest[ticker] = market
    listed = [(t, m) for t, m in latest.items() if m is not None]
    return MarketBatch(
        rows=_to_table(listed),
        deleted=[t for t, m in latest.items() if m is None],
        rejects=rejects,
    )


def _to_table(markets: list[tuple[str, Market]]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [] for name in MARKETS_SCHEMA.names}
    for ticker, m in markets:
        columns[Markets.TICKER].append(ticker)
        for name in _COPIED:
            columns[name].append(getattr(m, name))
        columns[Markets.UPDATED_AT].append(m.updated_at_ms * 1000)
    stamp = Markets.UPDATED_AT  # epoch microseconds until cast
    return pa.table(
        {
            name: pa.array(values, pa.int64() if name == stamp else f.type).cast(f.type)
            for (name, values), f in zip(columns.items(), MARKETS_SCHEMA, strict=True)
        },
        schema=MARKETS_SCHEMA,
    )


class MarketsWriter:
    """markets: MERGE each micro-batch's latest records into ``markets``."""

    def __init__(self, lake: Lake) -> None:
        self._lake = lake

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        batch = decode_markets(batch_df.select("key", "value", "partition", "offset").toArrow())
        records.log_rejects(f"markets batch {batch_id}", batch.rejects)
        if batch.rows.num_rows == 0 and not batch.deleted:
            return
        self._lake.merge_markets(batch_df.sparkSession, batch.rows, batch.deleted)
        log.info(
            "markets batch %d: %d markets merged, %d removed in %.0f ms",
            batch_id,
            batch.rows.num_rows,
            len(batch.deleted),
            (time.monotonic() - started) * 1000,
        )


def start(spark: SparkSession, settings: Settings, lake: Lake) -> StreamingQuery:
    m = settings.markets
    return start_query(
        kafka_source(spark, settings, settings.kafka.topic_markets, m.max_offsets_per_trigger),
        name=QUERY_NAME,
        settings=settings,
        function=MarketsWriter(lake),
        trigger_s=m.trigger_s,
        pool=BACKGROUND_POOL,  # metadata changes rarely: history and live candles first
    )
