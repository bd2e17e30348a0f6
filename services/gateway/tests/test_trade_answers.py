"""GET /trades without I/O: the query, the headers and the answer encoded batch by batch
(gateway.trade_answers): the pieces joined are one valid JSON, Arrow or Parquet body."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.messages import GatewayError, HistoryFormat
from gateway.trade_answers import TradeEncoder, TradesParams, parse_trades_query, report_headers
from mdclient.trades import REPORT_KEY, RangeGap, integrity_report
from mdproto.tables import Ticks, arrow_schema

T = "BINANCE:BTC/USDT"
REPAIRED = RangeGap(
    gap_id="g", ticker=T, cause="RECONNECT", from_time_ms=3_000, to_time_ms=4_000,
    missing_ids=0, trades_recovered=2, reason="", status="REPAIRED",
)  # fmt: skip
REPORT = integrity_report(T, 1_000, 9_000, span=(2_000, 20_000), gaps=[REPAIRED])
SCHEMA = arrow_schema(Ticks.SCHEMA)


def rows(times_ms: list[int]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                Ticks.TICKER: T, Ticks.EXCHANGE: "BINANCE", Ticks.SYMBOL: "BTC/USDT",
                Ticks.TRADE_ID: f"id{ms}", Ticks.PRICE: 1.5, Ticks.AMOUNT: 2.0,
                Ticks.SIDE: None, Ticks.TRADE_TIME: ms * 1000, Ticks.INGESTED_AT: None,
            }
            for ms in times_ms
        ],
        schema=SCHEMA,
    )  # fmt: skip


def encode(fmt: HistoryFormat, table: pa.Table, chunk: int = 2) -> bytes:
    encoder = TradeEncoder(fmt, REPORT, SCHEMA)
    parts = [encoder.start()]
    parts += [encoder.batch(b) for b in table.to_batches(max_chunksize=chunk)]
    return b"".join([*parts, encoder.finish()])


@pytest.mark.parametrize("n", [0, 1, 5])
def test_json_streams_one_document_with_the_report_first(n: int) -> None:
    table = rows([2_000 + i for i in range(n)])
    data = json.loads(encode("json", table))
    assert list(data) == ["ticker", "integrity", "trades", "row_count"]
    assert data["integrity"] == REPORT.as_dict() and data["row_count"] == str(n)
    assert [t["trade_id"] for t in data["trades"]] == [f"id{2_000 + i}" for i in range(n)]
    if n:
        assert data["trades"][0] == {
            "trade_id": "id2000", "price": 1.5, "amount": 2.0, "side": None,
            "trade_time_ms": "2000", "ingested_at_ms": None,
        }  # fmt: skip


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_arrow_and_parquet_carry_the_rows_and_the_report(fmt: HistoryFormat) -> None:
    table = rows([2_000, 2_001, 2_002])
    body = encode(fmt, table)
    read = (
        pa.ipc.open_stream(body).read_all() if fmt == "arrow" else pq.read_table(io.BytesIO(body))
    )
    assert read.to_pylist() == table.to_pylist()
    assert json.loads(read.schema.metadata[REPORT_KEY]) == REPORT.as_dict()


def test_headers_summarise_the_report() -> None:
    assert report_headers(REPORT) == {
        "X-Integrity-State": "partial",  # recorded from 2000 on, asked from 1000
        "X-Recorded-Since-Ms": "2000",
        "X-Not-Recorded-Until-Ms": "2000",
        "X-Gaps-Open": "0",
        "X-Gaps-Repairing": "0",
        "X-Gaps-Repaired": "1",
        "X-Gaps-Unrepairable": "0",
    }


def test_the_query_is_checked() -> None:
    assert parse_trades_query({"ticker": " binance:btc/usdt", "start": "1700000000000"}) == (
        TradesParams(T, 1_700_000_000_000, "now")
    )
    assert (
        parse_trades_query({"ticker": T, "start": "-2h", "end": "now", "token": "x"}).start == "-2h"
    )
    for query, words in (
        ({"start": "-1h"}, "missing parameter 'ticker'"),
        ({"ticker": T}, "missing parameter 'start'"),
        ({"ticker": T, "start": "-1h", "limit": "5"}, "unknown parameter(s): limit"),
    ):
        with pytest.raises(GatewayError) as info:
            parse_trades_query(query)
        assert info.value.error_code == "bad_request" and words in info.value.reason
