"""OHLCBatch records of one request (docs/protocol.md, "OHLCBatch records of one request").

Pure: candles in, protobuf records out, in the order they must be written.

- sequence 0 carries `metadata` and the first rows;
- sequences 1..n-1 carry up to `batch_size` rows each;
- the final marker (`is_final`, no rows, `metadata` with status and totals)
  has sequence n = `total_batches`, the number of data records before it;
- a request without candles is a lone final marker (NOT_FOUND) at sequence 0;
- a failure ends with an ERROR final marker after the records already written.
"""

from __future__ import annotations

from collections.abc import Iterable

from ingestor.model import Candle
from mdproto.contracts import FROM_STORAGE
from mdproto.messages import OHLC, BatchMetadata, DataRequest, OHLCBatch, Status


def metadata_for(request: DataRequest, ingestor_id: str) -> BatchMetadata:
    return BatchMetadata(
        request_id=request.request_id,
        client_id=request.client_id,
        ticker=request.ticker,
        period_seconds=request.period_seconds,
        start_time_ms=request.start_time_ms,
        end_time_ms=request.end_time_ms,
        notification_topic=request.notification_topic,
        ingestor_id=ingestor_id,
        submitted_at_ms=request.submitted_at_ms,
    )


def ohlc_row(ticker: str, period_seconds: int, candle: Candle) -> OHLC:
    """The OHLC row of a closed candle; fields the exchange did not report stay unset
    (protobuf treats a None keyword as unset)."""
    return OHLC(
        ticker=ticker,
        period_seconds=period_seconds,
        open_time_ms=candle.open_time_ms,
        open=candle.open,
        high=candle.high,
        low=candle.low,
        close=candle.close,
        volume=candle.volume,
        trade_count=candle.trade_count,
        quote_volume=candle.quote_volume,
        taker_buy_volume=candle.taker_buy_volume,
        taker_buy_quote_volume=candle.taker_buy_quote_volume,
        closed=True,
    )


class BatchBuilder:
    """Cuts a request's candles into OHLCBatch records as they arrive."""

    def __init__(self, metadata: BatchMetadata, batch_size: int) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self._metadata = metadata
        self._batch_size = batch_size
        self._pending: list[Candle] = []
        self._sequence = 0
        self._rows_emitted = 0
        self._finished = False

    @property
    def rows_emitted(self) -> int:
        """Rows in the data records handed out so far."""
        return self._rows_emitted

    @property
    def batches_emitted(self) -> int:
        """Data records handed out so far (the final marker not included)."""
        return self._sequence

    def add(self, candles: Iterable[Candle]) -> list[OHLCBatch]:
        """Queue candles; returns the records that are now full."""
        self._check_open()
        self._pending.extend(candles)
        records: list[OHLCBatch] = []
        while len(self._pending) >= self._batch_size:
            chunk = self._pending[: self._batch_size]
            del self._pending[: self._batch_size]
            records.append(self._data_record(chunk))
        return records

    def flush(self) -> list[OHLCBatch]:
        """The last, partial data record, if rows are still queued."""
        self._check_open()
        records = [self._data_record(self._pending)] if self._pending else []
        self._pending = []
        return records

    def set_source(self, source: int) -> None:
        """Where the answer comes from (HistorySource), carried by the final marker."""
        self._metadata.source = source  # type: ignore[assignment]

    def final(self, expected_gaps: int, expected_candles: int = 0) -> OHLCBatch:
        """The final marker after a successful fetch: OK, or NOT_FOUND without rows.

        Call `flush` first and make sure its records were delivered.
        """
        self._check_open()
        if self._pending:
            raise RuntimeError("rows are still queued: flush() before final()")
        # Stored candles count too: the pipeline counts them in Iceberg (docs/protocol.md).
        if self._rows_emitted > 0 or self._metadata.source in FROM_STORAGE:
            return self._final(Status.OK, "", "", expected_gaps, expected_candles)
        reason = "the exchange has no candles in the range"
        return self._final(Status.NOT_FOUND, reason, "", expected_gaps, expected_candles)

    def fail(
        self, reason: str, error_code: str, expected_gaps: int = 0, expected_candles: int = 0
    ) -> OHLCBatch:
        """The ERROR final marker; queued rows are dropped, totals count the emitted ones."""
        self._pending = []
        return self._final(Status.ERROR, reason, error_code, expected_gaps, expected_candles)

    def _data_record(self, chunk: list[Candle]) -> OHLCBatch:
        meta = self._metadata
        record = OHLCBatch(request_id=meta.request_id, sequence=self._sequence)
        if self._sequence == 0:
            record.metadata.CopyFrom(meta)
        rows = record.rows
        ticker, period = meta.ticker, meta.period_seconds
        for c in chunk:  # ohlc_row's fields again: sharing them as a dict made this 3x slower
            rows.add(
                ticker=ticker,
                period_seconds=period,
                open_time_ms=c.open_time_ms,
                open=c.open,
                high=c.high,
                low=c.low,
                close=c.close,
                volume=c.volume,
                trade_count=c.trade_count,  # None: unset, the exchange did not say
                quote_volume=c.quote_volume,
                taker_buy_volume=c.taker_buy_volume,
                taker_buy_quote_volume=c.taker_buy_quote_volume,
                closed=True,
            )
        self._sequence += 1
        self._rows_emitted += len(chunk)
        return record

    def _final(self, status: int, reason: str, error_code: str, gaps: int, slots: int) -> OHLCBatch:
        meta = BatchMetadata()
        meta.CopyFrom(self._metadata)
        meta.status = status  # type: ignore[assignment]
        meta.reason = reason
        meta.error_code = error_code
        meta.total_rows = self._rows_emitted
        meta.total_batches = self._sequence
        meta.expected_gaps = gaps
        meta.expected_candles = slots
        self._finished = True
        return OHLCBatch(
            request_id=meta.request_id, sequence=self._sequence, metadata=meta, is_final=True
        )

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("the request's final marker was already built")
