"""The recording summary, pure: file statistics and rows -> pieces -> one line per market,
and how the CLI shows it (table, notes, CSV, JSON shape). No I/O."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pyarrow as pa
from rich.console import Console

from mdclient.cli.output import lost_gap_line, recording_notes, recording_table, write_recording_csv
from mdclient.recording import (
    DAY_US,
    PIECES,
    GapCounts,
    file_piece,
    pieces_from_files,
    pieces_from_trades,
    summarise,
)
from mdproto.tables import Gaps, Ticks, arrow_schema

BTC, ETH, SOL = "BINANCE:BTC/USDT", "BINANCE:ETH/USDT", "KRAKEN:SOL/EUR"
TODAY_US = 1_795_132_800_000_000  # 2026-11-20T00:00Z
NOW_MS = TODAY_US // 1000 + 10 * 3600_000  # 10:00 that day
HOUR_US = 3600_000_000


def trades(*rows: tuple[str, int]) -> pa.Table:
    schema = arrow_schema(Ticks.SCHEMA, (Ticks.TICKER, Ticks.TRADE_TIME))
    return pa.Table.from_pylist(
        [{Ticks.TICKER: t, Ticks.TRADE_TIME: us} for t, us in rows], schema=schema
    )


def gap(ticker: str, status: str, n: int, reason: str = "", missing: int = 0) -> dict[str, Any]:
    return {
        Gaps.GAP_ID: f"{ticker}|{n}|{n + 9}",
        Gaps.TICKER: ticker,
        Gaps.EXCHANGE: ticker.partition(":")[0],
        Gaps.FROM_TRADE_ID: str(n),
        Gaps.TO_TRADE_ID: str(n + 9),
        Gaps.FROM_TIME: TODAY_US + n * HOUR_US,
        Gaps.TO_TIME: TODAY_US + n * HOUR_US + 60_000_000,
        Gaps.CAUSE: "RECONNECT",
        Gaps.STATUS: status,
        Gaps.REASON: reason,
        Gaps.TRADES_RECOVERED: 0,
        Gaps.MISSING_IDS: missing,
    }


def gaps(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=arrow_schema(Gaps.SCHEMA))


def test_a_file_of_one_ticker_and_one_day_is_summarised_by_its_statistics_alone() -> None:
    piece = file_piece(BTC, 500, TODAY_US + 5, TODAY_US + HOUR_US)
    assert piece is not None
    assert (piece["day"], piece["trades"]) == (TODAY_US // DAY_US, 500)
    # Anything the statistics do not tell exactly is read instead:
    assert file_piece(None, 500, TODAY_US, TODAY_US + 1) is None  # no ticker partition
    assert file_piece(BTC, 500, None, TODAY_US) is None  # no bounds written
    assert file_piece(BTC, 500, TODAY_US - 1, TODAY_US + 1) is None  # spans midnight
    assert file_piece(BTC, 1, TODAY_US + DAY_US - 1, TODAY_US + DAY_US - 1) is not None


def test_rows_read_become_one_piece_per_ticker_and_utc_day() -> None:
    pieces = pieces_from_trades(
        trades(
            (BTC, TODAY_US - 1),  # 23:59:59.999999 the day before
            (BTC, TODAY_US),
            (BTC, TODAY_US + 7),
            (ETH, TODAY_US + 3),
        )
    )
    assert pieces.schema == PIECES
    got = sorted((r[Ticks.TICKER], r["day"].isoformat(), r["trades"]) for r in pieces.to_pylist())
    assert got == [(BTC, "2026-11-19", 1), (BTC, "2026-11-20", 2), (ETH, "2026-11-20", 1)]
    assert pieces_from_trades(trades()).num_rows == 0


def test_summary_spans_files_and_rows_counts_today_and_tallies_gaps_per_market() -> None:
    pieces = pa.concat_tables(
        [
            pieces_from_files(
                [
                    file_piece(BTC, 100, TODAY_US - 3 * DAY_US, TODAY_US - 3 * DAY_US + 9),
                    file_piece(BTC, 40, TODAY_US + HOUR_US, TODAY_US + 2 * HOUR_US),
                    file_piece(SOL, 7, TODAY_US - DAY_US, TODAY_US - DAY_US + 5),
                ]
            ),
            pieces_from_trades(trades((BTC, TODAY_US + 9 * HOUR_US), (ETH, TODAY_US + 1))),
        ]
    )
    table = gaps(
        gap(BTC, "REPAIRED", 1),
        gap(BTC, "UNREPAIRABLE", 5, reason="bybit serves only its last 60 trades"),
        gap(BTC, "UNREPAIRABLE", 3, reason="exchange returned 2 of 9", missing=9),
        gap(ETH, "OPEN", 2),
        gap(ETH, "REPAIRING", 4),
        gap(ETH, "STATE_UNSPECIFIED", 6),  # not known to be repaired: counted open
        gap("BINANCE:XRP/USDT", "OPEN", 1),  # a gap before any stored trade
    )
    status = summarise(pieces, table, exchange=None, now_ms=NOW_MS)
    assert status.day == "2026-11-20" and status.gaps_note == ""
    by = {m.ticker: m for m in status.markets}
    assert list(by) == sorted(by) == [BTC, ETH, "BINANCE:XRP/USDT", SOL]

    btc = by[BTC]
    assert btc.since_ms == (TODAY_US - 3 * DAY_US) // 1000
    assert btc.last_trade_ms == (TODAY_US + 9 * HOUR_US) // 1000
    assert btc.trades_today == 41  # 40 from a file, 1 read; the older file is not today
    assert btc.gaps == GapCounts(repaired=1, unrepairable=2)
    assert btc.state == "incomplete"
    assert [g.reason for g in btc.unrepairable] == [  # oldest first
        "exchange returned 2 of 9",
        "bybit serves only its last 60 trades",
    ]
    assert btc.unrepairable[0].from_time_ms == (TODAY_US + 3 * HOUR_US) // 1000
    assert btc.unrepairable[0].missing_ids == 9

    assert by[ETH].gaps == GapCounts(open=2, repairing=1) and by[ETH].state == "repairing"
    assert by[ETH].trades_today == 1
    xrp = by["BINANCE:XRP/USDT"]
    assert (xrp.since_ms, xrp.last_trade_ms, xrp.trades_today) == (None, None, 0)
    assert by[SOL].gaps == GapCounts() and by[SOL].state == "ok"  # fed, never a gap
    assert by[SOL].trades_today == 0

    binance = summarise(pieces, table, exchange="BINANCE", now_ms=NOW_MS)
    assert [m.ticker for m in binance.markets] == [BTC, ETH, "BINANCE:XRP/USDT"]
    assert [g.ticker for g in binance.lost_gaps] == [BTC, BTC]


def test_a_repaired_gap_awaiting_its_trades_counts_as_repairing() -> None:
    pieces = pieces_from_files([file_piece(BTC, 3, TODAY_US, TODAY_US + 1)])
    table = gaps(gap(BTC, "REPAIRED", 1), gap(BTC, "REPAIRED", 2))
    waiting = frozenset({f"{BTC}|1|10"})
    (btc,) = summarise(pieces, table, exchange=None, now_ms=NOW_MS, awaiting=waiting).markets
    assert (btc.gaps, btc.state) == (GapCounts(repairing=1, repaired=1), "repairing")


def test_without_the_gaps_table_the_counts_are_unknown_and_say_why() -> None:
    pieces = pieces_from_files([file_piece(BTC, 3, TODAY_US, TODAY_US + 1)])
    note = "Iceberg table market.gaps does not exist yet: the pipeline creates it"
    status = summarise(pieces, None, exchange="BINANCE", now_ms=NOW_MS, gaps_note=note)
    (btc,) = status.markets
    assert (btc.gaps, btc.state, btc.trades_today) == (None, "unknown", 3)
    assert status.as_dict()["gaps_known"] is False
    assert recording_notes(status) == [f"gaps unknown: {note}"]
    assert status.table().column("gaps_open").to_pylist() == [None]


def test_nothing_stored_is_an_empty_status() -> None:
    status = summarise(PIECES.empty_table(), gaps(), exchange="OKX", now_ms=NOW_MS)
    assert status.markets == () and status.as_dict()["markets"] == []


def _status() -> Any:
    pieces = pieces_from_files(
        [
            file_piece(BTC, 12345, TODAY_US + 1_000_000, TODAY_US + 9 * HOUR_US),
            file_piece(ETH, 2, TODAY_US - DAY_US, TODAY_US - DAY_US + 1_000_000),
        ]
    )
    table = gaps(
        gap(BTC, "REPAIRED", 1),
        gap(BTC, "UNREPAIRABLE", 3, reason="only the last 60 trades", missing=9),
        gap(ETH, "OPEN", 2),
    )
    return summarise(pieces, table, exchange="BINANCE", now_ms=NOW_MS)


def test_the_table_reads_at_a_glance_and_unrepairable_gaps_get_a_line_each() -> None:
    status = _status()
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(recording_table(status))
    text = console.export_text()
    assert "Recording of BINANCE: 2 markets (today = 2026-11-20 UTC)" in text
    btc = next(line for line in text.splitlines() if BTC in line).split()
    assert btc == [
        BTC, "incomplete", "2026-11-20", "00:00:01", "2026-11-20", "09:00:00", "12,345",
        "0", "0", "1", "1",
    ]  # fmt: skip
    eth = next(line for line in text.splitlines() if ETH in line).split()
    assert eth[1] == "repairing" and eth[6:] == ["0", "1", "0", "0", "0"]
    assert recording_notes(status) == [
        f"unrepairable: {BTC} 2026-11-20 03:00:00 -> 2026-11-20 03:01:00 (RECONNECT, "
        "9 ids missing, 0 recovered): only the last 60 trades"
    ]
    lost = status.lost_gaps[0]
    assert "cause unknown" in lost_gap_line(type(lost)(**{**_fields(lost), "cause": ""}))


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


def test_csv_and_json_carry_the_same_rows_for_scripts() -> None:
    status = _status()
    out = io.StringIO()
    write_recording_csv(status, out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [r["ticker"] for r in rows] == [BTC, ETH]
    assert rows[0]["since"] == "2026-11-20T00:00:01Z"
    assert rows[0]["since_ms"] == str((TODAY_US + 1_000_000) // 1000)
    assert (rows[0]["trades_today"], rows[0]["gaps_unrepairable"]) == ("12345", "1")
    assert rows[0]["unrepairable_reasons"] == "only the last 60 trades"
    assert (rows[1]["state"], rows[1]["gaps_open"], rows[1]["trades_today"]) == (
        "repairing",
        "1",
        "0",
    )

    data = json.loads(json.dumps(status.as_dict()))
    assert data["exchange"] == "BINANCE" and data["day"] == "2026-11-20"
    btc = data["markets"][0]
    # 64-bit integers as decimal strings, the gateway's rule; small counts are numbers
    assert btc["since_ms"] == rows[0]["since_ms"] and btc["trades_today"] == "12345"
    assert btc["gaps"] == {"open": 0, "repairing": 0, "repaired": 1, "unrepairable": 1}
    assert btc["unrepairable"][0]["reason"] == "only the last 60 trades"
    assert btc["unrepairable"][0]["missing_ids"] == "9"
