"""Default names and ports shared across services (see docs/protocol.md).

Services take these as config defaults; a deployment may override them, but
every service must then be given the same value.
"""

from __future__ import annotations

from typing import Final

from mdproto.gen.marketdata_pb2 import HistorySource

# ZeroMQ ports bound by the relay (and the pipeline's PUB).
INGESTOR_WORK_PORT: Final = 5555  # relay PUB -> ingestor SUB, topic "EXCHANGE:"
INGESTOR_RESPONSE_PORT: Final = 5556  # ingestor DEALER -> relay ROUTER (legacy sync)
PIPELINE_PUB_PORT: Final = 5557  # pipeline PUB <- relay XSUB
MARKET_DATA_PORT: Final = 5558  # relay XPUB <- client SUB
CLIENT_REQUEST_PORT: Final = 5559  # client REQ/DEALER -> relay ROUTER
INGESTOR_CONTROL_PORT: Final = 5560  # relay PUB -> ingestor SUB (spec said 5557: taken)
ENGINES_PORT: Final = 5561  # live engine XPUBs -> relay XSUB (bound by the relay, ADR 0014)

# Kafka topics.
KAFKA_OHLC_BATCHES: Final = "market.ohlc.batches"  # OHLCBatch, key = ticker
KAFKA_TICKS: Final = "market.ticks"  # Tick, key = ticker
# Closed live candles (OHLC, closed=true, key = ticker), the pipeline's own: its live
# engine writes them, its candles-store query MERGEs them into ICEBERG_OHLC.
KAFKA_LIVE_CANDLES: Final = "market.ohlc.live"
# Corrections of closed live candles (OHLC, closed=true, correction=true, key = ticker) the
# pipeline's driver has (a gap's rebuild): every live engine reads them, the one owning the
# ticker publishes them, in its epoch (one partition: a handful an hour).
KAFKA_LIVE_CORRECTIONS: Final = "market.ohlc.corrections"
# L2 order books: BookSnapshot and BookDelta records of every live book, key = ticker, in
# the exchange's order (docs/protocol.md "Order books").
KAFKA_BOOK: Final = "market.book"
KAFKA_MARKETS: Final = "market.markets"  # Market, key = ticker (compacted)
KAFKA_INGEST_CLAIMS: Final = "ingest.claims"  # claim records, key = request_id (1 partition)
# Recording (docs/protocol.md "Recording"): the ingestors' recording slots. Partition p
# is slot p: the consumer group of an exchange's recorders assigns the slots, and each
# slot's partition holds its markets' RecordingCheckpoint (key = ticker) and TradeGap
# (key = "gap:{gap_id}") records, compacted. The pipeline reads the TradeGaps.
KAFKA_RECORDING: Final = "market.recording"
#: Partitions of KAFKA_RECORDING: the most ingestors that record one exchange at once.
#: A market's slot is `mdproto.topics.recording_slot(ticker)`; every ingestor must agree.
RECORDING_SLOTS: Final = 12
KAFKA_CEP_TRIGGERS: Final = "cep.triggers"  # CEPTriggerRequest, key = trigger_id (compacted)

# Iceberg tables (namespace.table) in the REST catalog.
ICEBERG_NAMESPACE: Final = "market"
ICEBERG_OHLC: Final = "market.ohlc"
ICEBERG_TICKS: Final = "market.ticks"
ICEBERG_REQUESTS: Final = "market.requests"  # one row per notified history request
ICEBERG_BOOK_SNAPSHOTS: Final = "market.book_snapshots"  # periodic L2 snapshots per ticker
ICEBERG_BOOK_DELTAS: Final = "market.book_deltas"  # every stored BookDelta: books between them
ICEBERG_MARKETS: Final = "market.markets"  # one row per ticker, from KAFKA_MARKETS
ICEBERG_GAPS: Final = "market.gaps"  # one row per TradeGap.gap_id, its latest state
ICEBERG_TRADE_BARS: Final = "market.trade_bars"  # tick and volume bars from recorded trades

# Live candle periods (seconds) the pipeline aggregates and the relay accepts on
# `{ticker}|ohlc:{period}`; a subscription to any other period is REFUSED on
# `{ticker}|status`. The pipeline's `live.periods` and the relay's `live_periods`
# both default to this: change it here, not in one service.
LIVE_PERIODS: Final = (60, 300, 3600)

# History answers (partly) read from stored candles: the ingestor sends no rows for
# the stored part, so the final marker's total_rows is not the answer's row count;
# the pipeline counts the rows in Iceberg (docs/protocol.md, "Coverage").
FROM_STORAGE: Final = (HistorySource.SOURCE_STORAGE, HistorySource.SOURCE_STORAGE_AND_EXCHANGE)
# History answers built from recorded trades: for a period the exchange does not
# serve, the ingestor writes only a final marker of this source and the pipeline
# aggregates market.ticks into bars (docs/adr/0015-bars-from-trades.md).
FROM_TRADES: Final = HistorySource.SOURCE_TRADES
