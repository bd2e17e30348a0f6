"""Trade history through the REAL REST catalog + S3 (local_stack): tables `ticks` and
`gaps` made from mdproto.tables, read back by the SDK, the CLI and the gateway with
their integrity report, including ranges with no recording.

BTC's day 1 is written in two files whose trades interleave in time (one group to
read, put in order), day 2 in a third file; ETH has one trade, SOL none (a gap only)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestServer
from pyiceberg.catalog import load_catalog
from pyiceberg.transforms import DayTransform, IdentityTransform

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.platform import SdkUpstream
from mdclient import Client, InvalidRequest, NotRecorded
from mdclient.cli import main
from mdclient.config import ClientSettings
from mdclient.exit_codes import ExitCode
from mdclient.recording import GapCounts
from mdclient.trades import REPORT_KEY
from mdproto.tables import Gaps, TableSchema, Ticks, arrow_schema

pytestmark = pytest.mark.stack

BTC, ETH, SOL = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "BINANCE:SOL/USDT"
DAY_MS = 86_400_000
DAY1 = 1_700_000_000_000 // DAY_MS * DAY_MS  # 2023-11-14 00:00 UTC
DAY2 = DAY1 + DAY_MS
HOUR = 3_600_000
EARLY = [DAY1 - HOUR]  # the recording's first trade: the day before
FIRST = [DAY1 + HOUR + k * 1_000 for k in (0, 2, 4, 6)]  # file 1
SECOND = [DAY1 + HOUR + k * 1_000 for k in (1, 3, 5)]  # file 2, between file 1's trades
THIRD = [DAY2 + HOUR + k * 1_000 for k in range(5)]  # day 2


def ticks(ticker: str, times_ms: list[int]) -> pa.Table:
    exchange, _, symbol = ticker.partition(":")
    return pa.Table.from_pylist(
        [
            {
                Ticks.TICKER: ticker, Ticks.EXCHANGE: exchange, Ticks.SYMBOL: symbol,
                Ticks.TRADE_ID: str(ms - DAY1), Ticks.PRICE: 100.0 + (ms - DAY1) / 1000,
                Ticks.AMOUNT: 0.25, Ticks.SIDE: "SELL" if ms % 2 else "BUY",
                Ticks.TRADE_TIME: ms * 1000, Ticks.INGESTED_AT: (ms + 7) * 1000,
            }
            for ms in times_ms
        ],
        schema=arrow_schema(Ticks.SCHEMA),
    )  # fmt: skip


def gap(
    ticker: str, n: int, status: str, from_ms: int, to_ms: int, reason: str = ""
) -> dict[str, Any]:
    return {
        Gaps.GAP_ID: f"{ticker}|{n}", Gaps.TICKER: ticker, Gaps.EXCHANGE: "BINANCE",
        Gaps.FROM_TRADE_ID: str(n), Gaps.TO_TRADE_ID: str(n + 3),
        Gaps.FROM_TIME: from_ms * 1000, Gaps.TO_TIME: to_ms * 1000,
        Gaps.DETECTED_AT: to_ms * 1000, Gaps.CAUSE: "RECONNECT", Gaps.STATUS: status,
        Gaps.REASON: reason, Gaps.TRADES_RECOVERED: 2 if status == "REPAIRED" else 0,
        Gaps.MISSING_IDS: 0, Gaps.INGESTOR_ID: "ing-1", Gaps.UPDATED_AT: to_ms * 1000,
    }  # fmt: skip


LOST = "the exchange serves only its last 60 trades"


def new_table(catalog: Any, name: str, shape: TableSchema) -> Any:
    """`shape` as mdproto.tables has it: columns, and its identity and day partitions."""
    transforms: dict[str, Any] = {"identity": IdentityTransform(), "day": DayTransform()}
    with catalog.create_table(name, schema=arrow_schema(shape)).update_spec() as spec:
        for p in shape.partitioning:
            spec.add_field(p.column, transforms[p.transform])
    return catalog.load_table(name)


def client_fields(lake: dict[str, Any]) -> dict[str, str]:
    """The client settings of the stack's catalog and of this module's tables."""
    catalog = lake["endpoints"].catalog_settings().model_dump()
    named = {"name": "catalog_name", "uri": "catalog_uri"}
    fields = {named.get(key, key): str(value) for key, value in catalog.items()}
    return {**fields, "ticks_table": lake["ticks"], "gaps_table": lake["gaps"]}


def settings(lake: dict[str, Any], relay: Any) -> ClientSettings:
    return ClientSettings.model_validate(
        {
            **client_fields(lake),
            "request_endpoint": relay.request_endpoint,
            "market_data_endpoint": relay.market_data_endpoint,
        }
    )


@pytest.fixture(scope="module")
def lake(local_stack: Any) -> dict[str, Any]:
    endpoints = local_stack.endpoints
    catalog = load_catalog(endpoints.catalog_name, **endpoints.pyiceberg_catalog_properties())
    namespace = f"trades_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    table = new_table(catalog, f"{namespace}.ticks", Ticks.SCHEMA)
    table.append(pa.concat_tables([ticks(BTC, EARLY + FIRST), ticks(ETH, [DAY1 + 5 * HOUR])]))
    table.append(ticks(BTC, SECOND))
    table.append(ticks(BTC, THIRD))
    gaps = new_table(catalog, f"{namespace}.gaps", Gaps.SCHEMA)
    gaps.append(
        pa.Table.from_pylist(
            [
                gap(BTC, 1, "REPAIRED", FIRST[1], FIRST[2]),
                gap(BTC, 2, "UNREPAIRABLE", THIRD[1], THIRD[2], LOST),
                gap(SOL, 3, "OPEN", DAY1, DAY1 + 1),
            ],
            schema=arrow_schema(Gaps.SCHEMA),
        )
    )
    return {"endpoints": endpoints, "ticks": f"{namespace}.ticks", "gaps": f"{namespace}.gaps"}


def expected(times_ms: list[int]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ticks(BTC, sorted(times_ms)).to_pylist()
    return rows


def test_sdk_reads_a_day_in_order_with_its_report(fake_relay: Any, lake: dict[str, Any]) -> None:
    with Client(settings=settings(lake, fake_relay)) as client:
        day1 = client.trades(BTC, DAY1, DAY2)
        both = client.trades(BTC, DAY1, DAY2 + DAY_MS)
        batches = client.trade_batches(BTC, DAY1, DAY2 + DAY_MS, batch_rows=3)
        streamed = list(batches)
        prices = client.trades(BTC, DAY1, DAY2, columns=[Ticks.PRICE])
        with pytest.raises(InvalidRequest):
            client.trades(BTC, DAY2, DAY1)
    assert day1.table.to_pylist() == expected(FIRST + SECOND)
    r = day1.report
    assert (r.state, r.recorded_since_ms, r.last_trade_ms) == ("complete", EARLY[0], THIRD[-1])
    assert r.counts == GapCounts(repaired=1) and r.not_recorded_until_ms is None

    assert both.table.to_pylist() == expected(FIRST + SECOND + THIRD)
    assert both.report.state == "incomplete"
    assert [g.reason for g in both.report.gaps or ()] == ["", LOST]

    assert [b.num_rows for b in streamed] == [3, 3, 1, 3, 2]  # day 1's group, then day 2's
    assert pa.Table.from_batches(streamed).to_pylist() == both.table.to_pylist()
    assert batches.report == both.report and batches.rows == 12
    assert prices.table.column_names == [Ticks.PRICE, Ticks.TRADE_TIME]


def test_sdk_says_when_a_range_is_not_recorded(fake_relay: Any, lake: dict[str, Any]) -> None:
    with Client(settings=settings(lake, fake_relay)) as client:
        partial = client.trades(BTC, DAY1 - DAY_MS, EARLY[0] + 1)
        refused = {}
        for name, ticker, start, end in (
            ("before", BTC, DAY1 - 2 * DAY_MS, DAY1 - DAY_MS),
            ("after", BTC, DAY2 + DAY_MS, DAY2 + 2 * DAY_MS),
            ("never", "BINANCE:DOGE/USDT", DAY1, DAY2),
            ("gap only", SOL, DAY1, DAY2),
        ):
            with pytest.raises(NotRecorded) as info:
                client.trade_batches(ticker, start, end)
            refused[name] = info.value
    assert partial.table.num_rows == 1
    assert (partial.report.state, partial.report.not_recorded_until_ms) == ("partial", EARLY[0])
    assert {k: e.report.state for k, e in refused.items()} == dict.fromkeys(refused, "not_recorded")
    assert "began after the range ends" in refused["before"].reason
    assert "after the range starts" in refused["after"].reason
    assert "never recorded" in refused["never"].reason
    assert refused["gap only"].report.counts == GapCounts(open=1)
    assert refused["never"].error_code == "not_recorded"


def _cli(lake: dict[str, Any], monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    for key, value in client_fields(lake).items():
        monkeypatch.setenv(f"MDCLIENT_{key.upper()}", value)
    return main(["trades", *args])


def test_a_repaired_gap_is_repairing_until_its_trades_are_stored(
    fake_relay: Any, lake: dict[str, Any]
) -> None:
    """The ingestor writes REPAIRED once the recovered trades are in Kafka; ticks-persist
    stores them later. Until it has, the range's trades are not complete."""
    link, ends, inside = "BINANCE:LINK/USDT", [DAY1 + 100, DAY1 + 103], [DAY1 + 101, DAY1 + 102]
    catalog = load_catalog(
        lake["endpoints"].catalog_name, **lake["endpoints"].pyiceberg_catalog_properties()
    )
    catalog.load_table(lake["ticks"]).append(ticks(link, ends))  # ids "100" and "103"
    repaired = gap(link, 100, "REPAIRED", *ends)  # ids 101-102 recovered, REPAIRED at 103
    catalog.load_table(lake["gaps"]).append(
        pa.Table.from_pylist([repaired], schema=arrow_schema(Gaps.SCHEMA))
    )
    with Client(settings=settings(lake, fake_relay)) as client:
        before = client.trades(link, ends[0], DAY2).report
        recording_before = client.recording("BINANCE")
        catalog.load_table(lake["ticks"]).append(ticks(link, inside))
        after = client.trades(link, ends[0], DAY2).report
        recording_after = client.recording("BINANCE")
    assert (before.state, before.counts) == ("repairing", GapCounts(repairing=1))
    assert [g.trades_stored for g in before.gaps or ()] == [0]
    assert (after.state, after.counts) == ("complete", GapCounts(repaired=1))
    assert [g.trades_stored for g in after.gaps or ()] == [2]
    # The recording's status counts the gap as its trades do.
    (was,) = [m for m in recording_before.markets if m.ticker == link]
    (now,) = [m for m in recording_after.markets if m.ticker == link]
    assert (was.state, was.gaps) == ("repairing", GapCounts(repairing=1))
    assert (now.state, now.gaps) == ("ok", GapCounts(repaired=1))


def test_cli_writes_the_trades_and_prints_the_report(
    lake: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    csv_path, parquet_path = tmp_path / "t.csv", tmp_path / "t.parquet"
    rng = ["--start", str(DAY1), "--end", str(DAY2 + DAY_MS)]
    files = ["--csv", str(csv_path), "--parquet", str(parquet_path)]
    code = _cli(lake, monkeypatch, BTC, *rng, *files, "--rows", "4")
    out, err = capsys.readouterr()
    assert code == ExitCode.OK
    assert "12 trades" in err and "integrity: incomplete" in err and LOST in err
    assert "gaps in the range: 1 repaired, 1 unrepairable" in err
    assert "… 8 more rows" in out
    assert csv_path.read_text().startswith("ticker,exchange,symbol,trade_id,")
    with csv_path.open() as text:
        row, *rest = csv.DictReader(text)
    assert len(rest) == 11 and row["trade_time_ms"] == str(FIRST[0])
    assert row["trade_time"] == "2023-11-14T01:00:00.000000Z" and row["ticker"] == BTC
    stored = pq.read_table(parquet_path)
    assert stored.to_pylist() == expected(FIRST + SECOND + THIRD)
    report = json.loads(stored.schema.metadata[REPORT_KEY])
    assert report["state"] == "incomplete" and report["recorded_since_ms"] == str(EARLY[0])

    assert (
        _cli(lake, monkeypatch, BTC, "--start", str(DAY1), "--end", str(DAY2), "--verify")
        == ExitCode.OK
    )
    assert _cli(lake, monkeypatch, BTC, *rng, "--verify", "--no-table") == ExitCode.INCOMPLETE
    capsys.readouterr()
    assert (
        _cli(lake, monkeypatch, BTC, "--start", str(DAY1 - 3 * DAY_MS), "--end", str(DAY1 - DAY_MS))
        == ExitCode.NOT_FOUND
    )
    assert "not recorded: the recording of BINANCE:BTC/USDT began after" in capsys.readouterr().err


def test_gateway_streams_the_same_trades(fake_relay: Any, lake: dict[str, Any]) -> None:
    rng = f"ticker={BTC}&start={DAY1}&end={DAY2 + DAY_MS}"

    async def scenario(client: Client) -> dict[str, tuple[int, dict[str, str], bytes]]:
        app = create_app(GatewaySettings(), SdkUpstream(client))
        out = {}
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as http:
            for name, query in (
                ("json", rng),
                ("arrow", f"{rng}&format=arrow"),
                ("parquet", f"{rng}&format=parquet"),
                ("missing", f"ticker={BTC}&start={DAY1 - 3 * DAY_MS}&end={DAY1 - 2 * DAY_MS}"),
                ("bad", f"ticker={BTC}&start={DAY2}&end={DAY1}"),
            ):
                async with http.get(str(server.make_url(f"/trades?{query}"))) as resp:
                    out[name] = (resp.status, dict(resp.headers), await resp.read())
        return out

    with Client(settings=settings(lake, fake_relay)) as client:
        answers = asyncio.run(scenario(client))
        want = client.trades(BTC, DAY1, DAY2 + DAY_MS)
    status, headers, body = answers["json"]
    data = json.loads(body)
    assert status == 200 and headers["X-Integrity-State"] == "incomplete"
    assert headers["X-Gaps-Unrepairable"] == "1" and headers["X-Recorded-Since-Ms"] == str(EARLY[0])
    assert data["integrity"] == want.report.as_dict() and data["row_count"] == "12"
    assert [t["trade_id"] for t in data["trades"]] == want.table.column(Ticks.TRADE_ID).to_pylist()
    assert data["trades"][0]["trade_time_ms"] == str(FIRST[0])
    arrow = pa.ipc.open_stream(answers["arrow"][2]).read_all()
    assert answers["arrow"][0] == 200 and arrow.to_pylist() == want.table.to_pylist()
    parquet = pq.read_table(io.BytesIO(answers["parquet"][2]))
    assert parquet.to_pylist() == want.table.to_pylist()
    assert json.loads(parquet.schema.metadata[REPORT_KEY]) == want.report.as_dict()
    status, _, body = answers["missing"]
    refusal = json.loads(body)
    assert status == 404 and refusal["error_code"] == "not_recorded"
    assert refusal["integrity"]["state"] == "not_recorded"
    status, _, body = answers["bad"]
    assert status == 400 and json.loads(body)["error_code"] == "bad_time_range"


def test_cli_exports_a_file_per_day_and_a_rerun_resumes(
    lake: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`mdclient export`: BTC's two days as Parquet with their reports, SOL (a gap only)
    not recorded; a rerun after losing a day's file rewrites only that day."""
    for key, value in client_fields(lake).items():
        monkeypatch.setenv(f"MDCLIENT_{key.upper()}", value)
    argv = ["export", BTC, SOL, "--start", str(DAY1), "--end", str(DAY2 + DAY_MS)]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == ExitCode.OK
    first = capsys.readouterr().err
    assert "2 written, 0 skipped (already complete), 2 not recorded" in first
    btc = tmp_path / "trades" / "BINANCE" / "BTC-USDT"
    day1, day2 = btc / "2023-11-14.parquet", btc / "2023-11-15.parquet"
    assert pq.read_table(day1).to_pylist() == expected(FIRST + SECOND)
    assert pq.read_table(day2).to_pylist() == expected(THIRD)
    reports = {p.name: json.loads(p.read_text()) for p in btc.glob("*.report.json")}
    assert reports["2023-11-14.report.json"]["state"] == "complete"
    assert reports["2023-11-15.report.json"]["report"]["gap_counts"]["unrepairable"] == 1
    sol = tmp_path / "trades" / "BINANCE" / "SOL-USDT"
    assert sorted(p.name for p in sol.iterdir()) == [
        "2023-11-14.report.json", "2023-11-15.report.json",
    ]  # fmt: skip

    day2.unlink()  # as if the first run had stopped before day 2
    assert main([*argv, "--verify"]) == ExitCode.INCOMPLETE  # day 2 lost trades for good
    again = capsys.readouterr().err
    assert "BINANCE:BTC/USDT 2023-11-14: skipped, already complete, 7 rows" in again
    assert "1 written, 1 skipped (already complete), 2 not recorded" in again
    assert pq.read_table(day2).to_pylist() == expected(THIRD)
