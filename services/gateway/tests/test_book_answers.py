"""GET /book and GET /book/samples: the queries, the answers, and the HTTP statuses over a
real aiohttp server with a fake platform (the SDK's pure book history behind it)."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.book_answers import (
    BookAtParams,
    SamplesParams,
    book_dict,
    encode_samples,
    parse_book_query,
    parse_samples_query,
)
from gateway.config import GatewaySettings
from gateway.messages import GatewayError
from mdclient import InvalidRequest, StorageError
from mdclient.book_history import DELTA_COLUMNS, SNAPSHOT_COLUMNS, book_at_from, sample
from mdproto.tables import BookDeltas, BookSnapshots, arrow_schema

T = "BINANCE:BTC/USDT"
T0 = 1_700_000_000_000
SEQ = 2**53 + 1  # a 64-bit sequence JavaScript would round


def _stored() -> tuple[pa.Table, pa.Table]:
    snaps = pa.Table.from_pylist(
        [
            {
                "snapshot_time": T0 * 1000,
                "exchange_sequence": SEQ,
                "depth": 2,
                "bids": [{"price": 100.0, "amount": 1.0}, {"price": 99.0, "amount": 2.0}],
                "asks": [{"price": 101.0, "amount": 1.5}],
            }
        ],
        schema=arrow_schema(BookSnapshots.SCHEMA, SNAPSHOT_COLUMNS),
    )
    changes = pa.Table.from_pylist(
        [
            {
                "delta_time": (T0 + 500) * 1000,
                "exchange_sequence": SEQ + 1,
                "exchange_prev_sequence": SEQ,
                "bids": [{"price": 100.0, "amount": 4.0}],
                "asks": [],
                "kafka_offset": 0,
            }
        ],
        schema=arrow_schema(BookDeltas.SCHEMA, DELTA_COLUMNS),
    )
    return snaps, changes


class FakePlatform:
    """SdkUpstream's book surface over the SDK's pure book history."""

    def __init__(self) -> None:
        self.failure: Exception | None = None

    def book_at(self, params: BookAtParams) -> tuple[Any, int]:
        if self.failure is not None:
            raise self.failure
        assert isinstance(params.at, int)
        return book_at_from(T, *_stored(), params.at), params.at

    def book_samples(self, params: SamplesParams) -> pa.Table:
        if self.failure is not None:
            raise self.failure
        assert isinstance(params.start, int) and params.every_ms == 500
        return sample(T, *_stored(), [params.start, params.start + 500], params.depth)


def serve(platform: FakePlatform, *paths: str) -> list[tuple[int, str, bytes]]:
    async def run() -> list[tuple[int, str, bytes]]:
        app = create_app(GatewaySettings(), upstream=platform)  # type: ignore[arg-type]
        out = []
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            for path in paths:
                async with http.get(f"{server.make_url('')}{path}") as resp:
                    out.append((resp.status, resp.content_type, await resp.read()))
        return out

    return asyncio.run(run())


def test_queries_are_checked() -> None:
    assert parse_book_query({"ticker": " binance:btc/usdt", "at": "1700000000000"}) == (
        BookAtParams(T, T0, 0)
    )
    assert parse_samples_query({"ticker": T, "start": "-1h", "depth": "5", "token": "x"}) == (
        SamplesParams(T, "-1h", "now", 1_000, 5)
    )
    for bad in ({"every": "soon"}, {"every": "0"}, {"depth": "0"}, {"depth": "1001"}):
        with pytest.raises(GatewayError) as refused:
            parse_samples_query({"ticker": T, "start": "1", **bad})
        assert refused.value.error_code == "bad_request"
    for query in (
        {"ticker": T},
        {"ticker": T, "at": "1", "x": "1"},
        {"ticker": T, "at": "1", "depth": "-1"},
    ):
        with pytest.raises(GatewayError):
            parse_book_query(query)


def test_the_book_json_sends_64_bit_values_as_strings_best_level_first() -> None:
    book = book_at_from(T, *_stored(), T0 + 500)
    body = book_dict(book, T0 + 500, 0)
    assert body["exact"] is True and body["gap"] is None
    assert body["exchange_sequence"] == str(SEQ + 1)
    assert (body["snapshot_time_ms"], body["book_time_ms"]) == (str(T0), str(T0 + 500))
    assert body["bids"] == [[100.0, 4.0], [99.0, 2.0]] and body["asks"] == [[101.0, 1.5]]
    assert book_dict(book, T0 + 500, 1)["bids"] == [[100.0, 4.0]]


def test_samples_are_served_as_json_arrow_and_parquet_and_errors_have_their_status() -> None:
    import pyarrow.parquet as pq

    platform = FakePlatform()
    span = f"ticker={T}&start={T0}&end={T0 + 1000}&every=500ms&depth=1"
    [(status, kind, data), (_, _, arrow), (_, _, parquet), (_, _, book)] = serve(
        platform,
        f"/book/samples?{span}",
        f"/book/samples?{span}&format=arrow",
        f"/book/samples?{span}&format=parquet",
        f"/book?ticker={T}&at={T0 + 100}",
    )
    assert (status, kind) == (200, "application/json")
    body = json.loads(data)
    assert (body["every_ms"], body["depth"], body["row_count"]) == ("500", 1, "2")
    first, second = body["samples"]
    assert first["time_ms"] == str(T0) and first["exact"] is True
    assert (first["bid_amount_0"], second["bid_amount_0"]) == (1.0, 4.0)
    assert second["exchange_sequence"] == str(SEQ + 1)
    table = pa.ipc.open_stream(arrow).read_all()
    assert table.column_names[:4] == ["time", "exact", "book_time", "exchange_sequence"]
    assert pq.read_table(io.BytesIO(parquet))["bid_amount_0"].to_pylist() == [1.0, 4.0]
    assert json.loads(book)["bids"][0] == [100.0, 1.0]  # before the delta

    platform.failure = StorageError("no book stored", error_code="no_book")
    platform_bad = FakePlatform()
    platform_bad.failure = InvalidRequest(
        "an empty range has no samples", error_code="bad_time_range"
    )
    [(missing, _, why)] = serve(platform, f"/book?ticker={T}&at={T0}")
    [(bad, _, reason)] = serve(platform_bad, f"/book/samples?{span}")
    assert (missing, json.loads(why)["error_code"]) == (404, "no_book")
    assert (bad, json.loads(reason)["error_code"]) == (400, "bad_time_range")


def test_encoding_keeps_the_sdk_table_in_binary_formats() -> None:
    table = sample(T, *_stored(), [T0], 2)
    arrow = encode_samples(table, "arrow", ticker=T, every_ms=1, depth=2)
    assert pa.ipc.open_stream(arrow).read_all().equals(table)
