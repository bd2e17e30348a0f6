"""What the platform records, through the REAL REST catalog + S3 (local_stack): tables
`ticks` and `gaps` made from mdproto.tables, read by the SDK, the CLI and the gateway.

`ticks` starts partitioned by ticker alone and gains the day partition later (as
`mdproto.tables` has it), so its first files hold two days of trades: those are read,
the later ones summarised from their manifest entries; both must agree."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from aiohttp.test_utils import TestServer
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.transforms import DayTransform, IdentityTransform, Transform

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.platform import SdkUpstream
from mdclient import Client, InvalidRequest, StorageError
from mdclient.cli import main
from mdclient.config import ClientSettings
from mdclient.exit_codes import ExitCode
from mdclient.frames import IcebergReader
from mdclient.recording import GapCounts
from mdproto.tables import Gaps, Partition, TableSchema, Ticks, arrow_schema

pytestmark = pytest.mark.stack

BTC, ETH, SOL, XRP = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "KRAKEN:SOL/EUR", "BYBIT:XRP/USDT"
DAY_MS = 86_400_000
TODAY_MS = int(time.time() * 1000) // DAY_MS * DAY_MS  # the UTC day the SDK counts
MINUTE_MS = 60_000
TOKEN = "s3cret"

_TRANSFORMS: dict[str, Transform[Any, Any]] = {
    "identity": IdentityTransform(),
    "day": DayTransform(),
}


def create_table(
    catalog: Catalog, name: str, shape: TableSchema, partitioning: tuple[Partition, ...]
) -> Any:
    """A table of `shape` (its columns, types, required) partitioned as given."""
    table = catalog.create_table(name, schema=arrow_schema(shape))
    add_partitions(table, partitioning)
    return catalog.load_table(name)


def add_partitions(table: Any, partitioning: tuple[Partition, ...]) -> None:
    with table.update_spec() as spec:
        for p in partitioning:
            spec.add_field(p.column, _TRANSFORMS[p.transform])


def ticks(ticker: str, times_ms: list[int]) -> pa.Table:
    exchange, _, symbol = ticker.partition(":")
    return pa.Table.from_pylist(
        [
            {
                Ticks.TICKER: ticker, Ticks.EXCHANGE: exchange, Ticks.SYMBOL: symbol,
                Ticks.TRADE_ID: f"{ticker}-{ms}-{i}", Ticks.PRICE: 100.0 + i, Ticks.AMOUNT: 0.5,
                Ticks.SIDE: "BUY", Ticks.TRADE_TIME: ms * 1000, Ticks.INGESTED_AT: ms * 1000,
            }
            for i, ms in enumerate(times_ms)
        ],
        schema=arrow_schema(Ticks.SCHEMA),
    )  # fmt: skip


def gap(ticker: str, status: str, n: int, reason: str = "", missing: int = 0) -> dict[str, Any]:
    start_ms = TODAY_MS - DAY_MS + n * MINUTE_MS
    return {
        Gaps.GAP_ID: f"{ticker}|{n}|{n + 5}", Gaps.TICKER: ticker,
        Gaps.EXCHANGE: ticker.partition(":")[0], Gaps.FROM_TRADE_ID: str(n),
        Gaps.TO_TRADE_ID: str(n + 5), Gaps.FROM_TIME: start_ms * 1000,
        Gaps.TO_TIME: (start_ms + MINUTE_MS) * 1000, Gaps.DETECTED_AT: start_ms * 1000,
        Gaps.CAUSE: "RECONNECT", Gaps.STATUS: status, Gaps.REASON: reason,
        Gaps.TRADES_RECOVERED: 0, Gaps.MISSING_IDS: missing, Gaps.INGESTOR_ID: "ing-1",
        Gaps.UPDATED_AT: start_ms * 1000,
    }  # fmt: skip


#: BTC: 3 trades two days ago and 2 yesterday (one file, read: it spans days), then 4
#: yesterday and 3 today in day partitions (their manifest entries alone).
BTC_OLD = [TODAY_MS - 2 * DAY_MS + 5, TODAY_MS - 2 * DAY_MS + 6, TODAY_MS - 2 * DAY_MS + 7]
BTC_LATER = [TODAY_MS - DAY_MS + 1, TODAY_MS - DAY_MS + 2]
BTC_YESTERDAY = [TODAY_MS - 3 * MINUTE_MS - i for i in range(4)]
BTC_TODAY = [TODAY_MS + 1_000, TODAY_MS + 2_000, TODAY_MS + 3_000]


@pytest.fixture(scope="module")
def lake(local_stack: Any) -> dict[str, Any]:
    endpoints = local_stack.endpoints
    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    namespace = f"recording_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    by_ticker = tuple(p for p in Ticks.SCHEMA.partitioning if p.transform == "identity")
    table = create_table(catalog, f"{namespace}.ticks", Ticks.SCHEMA, by_ticker)
    table.append(ticks(BTC, BTC_OLD + BTC_LATER))
    add_partitions(table, tuple(p for p in Ticks.SCHEMA.partitioning if p not in by_ticker))
    table = catalog.load_table(f"{namespace}.ticks")
    assert [f.transform for f in table.spec().fields] == [IdentityTransform(), DayTransform()]
    table.append(
        pa.concat_tables(
            [
                ticks(BTC, BTC_YESTERDAY + BTC_TODAY),
                ticks(ETH, [TODAY_MS + 10]),
                ticks(SOL, [TODAY_MS - DAY_MS + 10]),
            ]
        )
    )
    gaps = create_table(catalog, f"{namespace}.gaps", Gaps.SCHEMA, Gaps.SCHEMA.partitioning)
    gaps.append(
        pa.Table.from_pylist(
            [
                gap(BTC, "REPAIRED", 1),
                gap(BTC, "UNREPAIRABLE", 2, "the exchange serves only its last 60 trades", 7),
                gap(ETH, "OPEN", 3),
                gap(ETH, "REPAIRING", 4),
                gap(XRP, "OPEN", 5),
            ],
            schema=arrow_schema(Gaps.SCHEMA),
        )
    )
    return {
        "endpoints": endpoints,
        "ticks": f"{namespace}.ticks",
        "gaps": f"{namespace}.gaps",
    }


def settings(lake: dict[str, Any], relay: Any = None, **extra: Any) -> ClientSettings:
    e = lake["endpoints"]
    values: dict[str, Any] = {
        "request_endpoint": relay.request_endpoint if relay else "",
        "market_data_endpoint": relay.market_data_endpoint if relay else "",
        "catalog_name": e.catalog_name,
        "catalog_uri": e.catalog_uri,
        "warehouse": e.warehouse,
        "s3_endpoint": e.s3_endpoint,
        "s3_access_key": e.s3_access_key,
        "s3_secret_key": e.s3_secret_key,
        "s3_region": e.s3_region,
        "ticks_table": lake["ticks"],
        "gaps_table": lake["gaps"],
    }
    values.update(extra)
    return ClientSettings(**values)


def test_the_read_path_and_the_manifest_path_agree(lake: dict[str, Any]) -> None:
    """The file of the first spec spans two days: read, grouped by day. The others are
    summarised from their manifest entries: a piece each, never merged with the rows
    read (yesterday's 2 read and 4 from a file stay two pieces)."""
    s = settings(lake)
    reader = IcebergReader(s.catalog_properties(), catalog_name=s.catalog_name)
    pieces = reader.read_tick_pieces(lake["ticks"], "BINANCE")
    got = sorted((r[Ticks.TICKER], r["day"].isoformat(), r["trades"]) for r in pieces.to_pylist())
    day = [
        time.strftime("%Y-%m-%d", time.gmtime((TODAY_MS + k * DAY_MS) / 1000)) for k in (-2, -1, 0)
    ]
    assert got == [
        (BTC, day[0], 3),  # read: the pre-evolution file
        (BTC, day[1], 2),  # read: the same file
        (BTC, day[1], 4),  # a day partition's file
        (BTC, day[2], 3),
        (ETH, day[2], 1),
    ]


def test_sdk_tells_what_is_recorded(fake_relay: Any, lake: dict[str, Any]) -> None:
    with Client(settings=settings(lake, fake_relay)) as client:
        everything = client.recording()
        binance = client.recording("binance")
        with pytest.raises(InvalidRequest):
            client.recording("not an exchange")
    by = {m.ticker: m for m in everything.markets}
    assert list(by) == [BTC, ETH, XRP, SOL]
    btc = by[BTC]
    assert (btc.since_ms, btc.last_trade_ms, btc.trades_today) == (
        BTC_OLD[0],
        BTC_TODAY[-1],
        3,
    )
    assert btc.gaps == GapCounts(repaired=1, unrepairable=1) and btc.state == "incomplete"
    (lost,) = btc.unrepairable
    assert lost.reason == "the exchange serves only its last 60 trades" and lost.missing_ids == 7
    assert by[ETH].gaps == GapCounts(open=1, repairing=1) and by[ETH].trades_today == 1
    assert (by[XRP].since_ms, by[XRP].gaps) == (None, GapCounts(open=1))  # gap only
    assert by[SOL].gaps == GapCounts() and by[SOL].trades_today == 0
    assert [m.ticker for m in binance.markets] == [BTC, ETH]
    assert binance.exchange == "BINANCE" and everything.gaps_note == ""


def test_sdk_without_gaps_table_says_so_and_without_ticks_table_fails(
    fake_relay: Any, lake: dict[str, Any]
) -> None:
    with Client(settings=settings(lake, fake_relay, gaps_table="nope_ns.gaps")) as client:
        status = client.recording("BINANCE")
    assert [m.state for m in status.markets] == ["unknown", "unknown"]
    assert "does not exist yet" in status.gaps_note and "nope_ns.gaps" in status.gaps_note
    with (
        Client(settings=settings(lake, fake_relay, ticks_table="nope_ns.ticks")) as client,
        pytest.raises(StorageError) as info,
    ):
        client.recording()
    assert info.value.error_code == "no_table"


def _row(out: str, ticker: str) -> list[str]:
    """The table's row of `ticker`, split on spaces."""
    return next(line.split() for line in out.splitlines() if line.split()[:1] == [ticker])


def _cli(lake: dict[str, Any], *args: str) -> int:
    e = lake["endpoints"]
    return main(
        [
            "recording", *args,
            "--catalog-uri", e.catalog_uri, "--warehouse", e.warehouse,
            "--s3-endpoint", e.s3_endpoint,
        ]
    )  # fmt: skip


def test_cli_prints_the_recording(
    lake: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = lake["endpoints"]
    for key, value in {
        "CATALOG_NAME": e.catalog_name,
        "S3_ACCESS_KEY": e.s3_access_key,
        "S3_SECRET_KEY": e.s3_secret_key,
        "S3_REGION": e.s3_region,
        "TICKS_TABLE": lake["ticks"],
        "GAPS_TABLE": lake["gaps"],
    }.items():
        monkeypatch.setenv(f"MDCLIENT_{key}", value)

    assert _cli(lake, "BINANCE") == ExitCode.OK
    out = capsys.readouterr().out
    assert "Recording of BINANCE: 2 markets" in out
    btc = _row(out, BTC)
    assert btc[1] == "incomplete" and btc[6:] == ["3", "0", "0", "1", "1"]
    assert f"unrepairable: {BTC} " in out and "the exchange serves only its last 60 trades" in out
    assert "KRAKEN" not in out

    assert _cli(lake, "--format", "json") == ExitCode.OK
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert [m["ticker"] for m in data["markets"]] == [BTC, ETH, XRP, SOL]
    assert "unrepairable:" in captured.err  # notes leave stdout to the data

    assert _cli(lake, "binance", "--format", "csv") == ExitCode.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ticker,state,since,since_ms") and len(lines) == 3

    assert _cli(lake, "COINBASE") == ExitCode.NOT_FOUND
    assert "nothing recorded of COINBASE" in capsys.readouterr().err

    monkeypatch.setenv("MDCLIENT_GAPS_TABLE", "nope_ns.gaps")
    assert _cli(lake, "BINANCE") == ExitCode.OK
    out = capsys.readouterr().out
    assert "gaps unknown: Iceberg table nope_ns.gaps does not exist yet" in out
    assert _row(out, BTC)[6:] == [
        "3", "?", "?", "?", "?",
    ]  # fmt: skip

    monkeypatch.setenv("MDCLIENT_TICKS_TABLE", "nope_ns.ticks")
    assert _cli(lake, "BINANCE") == ExitCode.STORAGE
    err = capsys.readouterr().err
    assert "does not exist yet" in err and "no_table" in err


def test_gateway_serves_the_same_status(fake_relay: Any, lake: dict[str, Any]) -> None:
    async def scenario(client: Client) -> list[tuple[int, Any]]:
        app = create_app(GatewaySettings(token=TOKEN), SdkUpstream(client))
        out = []
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            for path, headers in (
                ("/recording?exchange=binance", auth),
                ("/recording", {}),
            ):
                async with http.get(str(server.make_url(path)), headers=headers) as resp:
                    out.append((resp.status, await resp.json()))
        return out

    with Client(settings=settings(lake, fake_relay)) as client:
        (ok, refused) = asyncio.run(scenario(client))
        expected = client.recording("BINANCE").as_dict()
    assert refused[0] == 401
    status, body = ok
    assert status == 200
    assert {**body, "as_of_ms": None} == {**expected, "as_of_ms": None}
    btc = body["markets"][0]
    assert btc["since_ms"] == str(BTC_OLD[0]) and btc["trades_today"] == "3"
    assert btc["unrepairable"][0]["reason"] == "the exchange serves only its last 60 trades"
