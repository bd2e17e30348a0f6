"""Reading market.ohlc-shaped tables through the REAL REST catalog + S3 (local_stack)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zmq
from pyiceberg.catalog import load_catalog

from mdclient import Client, HistoryTimeout, InvalidRequest, StorageError
from mdclient.cli import main
from mdclient.config import ClientSettings
from mdclient.dispatch import SequenceEvent
from mdclient.exit_codes import ExitCode
from mdclient.frames import SCHEMA, IcebergReader
from mdproto import envelope, topics
from mdproto.messages import (
    OHLC,
    HistorySource,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
    Tick,
)
from pipeline.config import Settings as PipelineSettings
from pipeline.history_notices import REQUESTS_SCHEMA  # the table as the pipeline writes it
from pipeline.pub_server import Publisher, PubServer

pytestmark = pytest.mark.stack

BTC = "BINANCE:BTC/USDT"
ETH = "BINANCE:ETH/USDT"
T0 = 1_795_132_800_000  # 2026-11-20T00:00Z
MINUTE = 60_000

# market.ohlc as in docs/protocol.md
OHLC_SCHEMA = pa.schema(
    [
        pa.field("ticker", pa.string()),
        pa.field("exchange", pa.string()),
        pa.field("symbol", pa.string()),
        pa.field("period_seconds", pa.int32()),
        pa.field("open_time", pa.timestamp("us", tz="UTC")),
        pa.field("open", pa.float64()),
        pa.field("high", pa.float64()),
        pa.field("low", pa.float64()),
        pa.field("close", pa.float64()),
        pa.field("volume", pa.float64()),
        pa.field("trade_count", pa.int64()),
        pa.field("source", pa.string()),
        pa.field("request_id", pa.string()),
        pa.field("ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


def _rows(ticker: str, period: int, start_ms: int, count: int, base: float) -> pa.Table:
    step = period * 1000
    opens = [base + (i % 7) - 3 for i in range(count)]
    closes = [o + (2 if i % 3 else -2) for i, o in enumerate(opens)]
    return pa.table(
        {
            "ticker": [ticker] * count,
            "exchange": ["BINANCE"] * count,
            "symbol": [ticker.split(":")[1]] * count,
            "period_seconds": [period] * count,
            "open_time": [(start_ms + i * step) * 1000 for i in range(count)],
            "open": opens,
            "high": [max(o, c) + 1.5 for o, c in zip(opens, closes, strict=True)],
            "low": [min(o, c) - 1.5 for o, c in zip(opens, closes, strict=True)],
            "close": closes,
            "volume": [10.0 + (i * 37) % 50 for i in range(count)],
            "trade_count": [100 + i for i in range(count)],
            "source": ["history"] * count,
            "request_id": ["seed"] * count,
            "ingested_at": [datetime.now(UTC)] * count,
        },
        schema=OHLC_SCHEMA,
    )


@pytest.fixture(scope="module")
def seeded(local_stack: Any) -> dict[str, Any]:
    """A fresh namespace's ohlc table: two appends, so two snapshots."""
    endpoints = local_stack.endpoints
    props = endpoints.pyiceberg_catalog_properties()
    catalog = load_catalog(endpoints.catalog_name, **props)
    namespace = f"mdclient_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.ohlc", schema=OHLC_SCHEMA)
    table.append(
        pa.concat_tables(
            [
                _rows(BTC, 60, T0, 90, 100.0),  # 00:00 .. 01:29
                _rows(ETH, 60, T0, 90, 10.0),
                _rows(BTC, 300, T0, 12, 100.0),
            ]
        )
    )
    first = table.current_snapshot()
    table.append(_rows(BTC, 60, T0 + 90 * MINUTE, 30, 100.0))  # 01:30 .. 01:59
    table = catalog.load_table(f"{namespace}.ohlc")
    return {
        "props": props,
        "catalog_name": endpoints.catalog_name,
        "table": f"{namespace}.ohlc",
        "first_snapshot": first.snapshot_id,
        "endpoints": endpoints,
    }


def test_filtered_scan_returns_only_the_range_of_one_ticker_and_period(seeded: Any) -> None:
    reader = IcebergReader(seeded["props"], catalog_name=seeded["catalog_name"])
    start, end = T0 + 10 * MINUTE, T0 + 100 * MINUTE
    table = reader.read_ohlc(seeded["table"], BTC, 60, start, end)
    assert table.schema == SCHEMA
    times = [t.value // 1000 for t in table.column("open_time")]
    assert times == list(range(start, end, MINUTE))  # [start, end): 90 rows, sorted
    assert set(table.column("ticker").to_pylist()) == {BTC}
    assert set(table.column("period_seconds").to_pylist()) == {60}


def test_scan_pinned_to_the_notified_snapshot_ignores_later_commits(seeded: Any) -> None:
    reader = IcebergReader(seeded["props"], catalog_name=seeded["catalog_name"])
    pinned = reader.read_ohlc(
        seeded["table"], BTC, 60, T0, T0 + 120 * MINUTE, snapshot_id=seeded["first_snapshot"]
    )
    current = reader.read_ohlc(seeded["table"], BTC, 60, T0, T0 + 120 * MINUTE)
    assert (pinned.num_rows, current.num_rows) == (90, 120)
    with pytest.raises(StorageError) as gone:  # the reader never switches in silence
        reader.read_ohlc(seeded["table"], BTC, 60, T0, T0 + 120 * MINUTE, snapshot_id=123)
    assert gone.value.error_code == "snapshot_gone" and "snapshot 123" in gone.value.reason


def test_missing_table_is_a_storage_error(seeded: Any) -> None:
    reader = IcebergReader(seeded["props"], catalog_name=seeded["catalog_name"])
    with pytest.raises(StorageError) as info:
        reader.read_ohlc("nope_ns.ohlc", BTC, 60, T0, T0 + MINUTE)
    assert info.value.error_code == "no_table"


def _stack_settings(relay: Any, seeded: Any, **extra: Any) -> ClientSettings:
    e = seeded["endpoints"]
    return ClientSettings(
        request_endpoint=relay.request_endpoint,
        market_data_endpoint=relay.market_data_endpoint,
        catalog_name=e.catalog_name,
        catalog_uri=e.catalog_uri,
        warehouse=e.warehouse,
        s3_endpoint=e.s3_endpoint,
        s3_access_key=e.s3_access_key,
        s3_secret_key=e.s3_secret_key,
        s3_region=e.s3_region,
        history_timeout_s=5,
        **extra,
    )


def _notify_with(kit: Any, seeded: Any, snapshot_id: int) -> Any:
    base = kit.accept_and_notify(snapshot_id=snapshot_id)

    def handle(message: Any) -> Any:
        action = base(message)
        for _topic, note in action.publish:
            note.iceberg_table = seeded["table"]
        return action

    return handle


def test_sdk_history_reads_the_notified_snapshot(fake_relay: Any, kit: Any, seeded: Any) -> None:
    fake_relay.handler = _notify_with(kit, seeded, seeded["first_snapshot"])
    with Client(settings=_stack_settings(fake_relay, seeded)) as client:
        result = client.history(BTC, "1m", T0, T0 + 120 * MINUTE)
        unpinned = client.history(BTC, "1m", T0, T0 + 120 * MINUTE, pin_snapshot=False)
    assert (result.status, len(result), result.snapshot_id) == ("OK", 90, seeded["first_snapshot"])
    frame = result.to_pandas()
    assert frame["open_time"].is_monotonic_increasing
    assert str(frame["open_time"].dt.tz) == "UTC"
    assert len(unpinned) == 120


def test_cli_history_writes_csv_parquet_and_chart(
    fake_relay: Any, kit: Any, seeded: Any, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    e = seeded["endpoints"]
    fake_relay.handler = _notify_with(kit, seeded, 0)
    monkeypatch.setenv("MDCLIENT_S3_ACCESS_KEY", e.s3_access_key)  # env layer
    monkeypatch.setenv("MDCLIENT_S3_SECRET_KEY", e.s3_secret_key)
    config = tmp_path / "client.yaml"
    config.write_text(
        f"catalog_name: {e.catalog_name}\nwarehouse: {e.warehouse}\n"
        f"s3_region: {e.s3_region}\nhistory_timeout_s: 5\n"
    )
    csv, parquet, chart = tmp_path / "c.csv", tmp_path / "c.parquet", tmp_path / "chart.png"
    code = main(
        [
            "history", "binance:btc/usdt", "--period", "1m",
            "--start", "2026-11-20T00:30", "--end", "2026-11-20T02:00",
            "--config", str(config),
            "--request-endpoint", fake_relay.request_endpoint,
            "--market-data-endpoint", fake_relay.market_data_endpoint,
            "--catalog-uri", e.catalog_uri, "--s3-endpoint", e.s3_endpoint,
            "--csv", str(csv), "--parquet", str(parquet), "--chart", str(chart),
            "--rows", "6",
        ]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == ExitCode.OK, out.err
    assert "… 84 more rows" in out.out and "2026-11-20 01:59:00" in out.out
    lines = csv.read_text().splitlines()
    assert lines[0].split(",")[:4] == ["ticker", "period_seconds", "open_time", "open_time_ms"]
    assert len(lines) == 91
    assert lines[1].split(",")[2:4] == ["2026-11-20T00:30:00Z", str(T0 + 30 * MINUTE)]
    assert pq.read_table(parquet).num_rows == 90
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 20_000


DONE_AT = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def requests_table(seeded: dict[str, Any]) -> str:
    catalog = load_catalog(seeded["catalog_name"], **seeded["props"])
    name: str = seeded["table"].replace(".ohlc", ".requests")
    table = catalog.create_table(name, schema=REQUESTS_SCHEMA)
    rows = [
        {"request_id": "r-ok", "status": "OK", "ticker": BTC, "period_seconds": 60,
         "start_time_ms": T0, "end_time_ms": T0 + 90 * MINUTE, "row_count": 90,
         "iceberg_table": seeded["table"], "snapshot_id": seeded["first_snapshot"],
         "completed_at": DONE_AT},
        {"request_id": "r-bad", "status": "ERROR", "error_code": "bad_symbol",
         "reason": "binance does not have market symbol NOPE/USDT", "ticker": BTC,
         "period_seconds": 60, "start_time_ms": T0, "end_time_ms": T0 + MINUTE, "row_count": 0,
         "snapshot_id": 0, "completed_at": DONE_AT},
    ]  # fmt: skip
    table.append(pa.Table.from_pylist(rows, schema=REQUESTS_SCHEMA))
    return name


def test_status_reads_the_recorded_outcome_of_a_request(
    fake_relay: Any, seeded: Any, requests_table: str
) -> None:
    settings = _stack_settings(fake_relay, seeded, requests_table=requests_table)
    with Client(settings=settings) as client:
        ok, bad, unknown = (client.status(r) for r in ("r-ok", "r-bad", "r-never"))
    assert (ok.state, ok.done, bad.state, unknown.state) == ("OK", True, "ERROR", "UNKNOWN")
    assert ok.notification is not None and bad.notification is not None
    assert (ok.notification.row_count, ok.notification.snapshot_id) == (
        90,
        seeded["first_snapshot"],
    )
    assert ok.notification.completed_at_ms == int(DONE_AT.timestamp() * 1000)
    assert (bad.notification.error_code, bad.notification.status) == ("bad_symbol", Status.ERROR)
    assert unknown.notification is None


def test_status_of_a_platform_that_never_notified_asks_the_relay(
    fake_relay: Any, seeded: Any, kit: Any
) -> None:
    """No requests table yet: no outcome; the relay tells an accepted id from another."""
    settings = _stack_settings(fake_relay, seeded, requests_table="nope_ns.requests")
    fake_relay.handler = kit.ack_only()
    with Client(settings=settings) as client:
        with pytest.raises(HistoryTimeout):
            client.history(BTC, "1m", T0, T0 + MINUTE, timeout_s=0.2, attempts=1)
        (submit,) = [m for m in fake_relay.requests if isinstance(m, SubmitHistoricalRequest)]
        assert client.status(submit.request_id).state == "PENDING"
        assert client.status("r-ok").state == "UNKNOWN"


@pytest.mark.parametrize(
    ("request_id", "code", "shown"),
    [
        ("r-ok", ExitCode.OK, "r-ok: OK, 90 rows, BINANCE:BTC/USDT 1m"),
        ("r-bad", ExitCode.FAILED, "ERROR, 0 rows"),
        ("r-never", ExitCode.UNKNOWN, "r-never: UNKNOWN"),
        ("r-acked", ExitCode.PENDING, "r-acked: PENDING"),
    ],
)
def test_cli_status_prints_the_outcome_with_its_exit_code(
    seeded: Any, requests_table: str, request_id: str, code: int, shown: str, capsys: Any,
    monkeypatch: Any, fake_relay: Any,
) -> None:  # fmt: skip
    e = seeded["endpoints"]
    monkeypatch.setenv("MDCLIENT_S3_ACCESS_KEY", e.s3_access_key)
    monkeypatch.setenv("MDCLIENT_S3_SECRET_KEY", e.s3_secret_key)
    monkeypatch.setenv("MDCLIENT_REQUESTS_TABLE", requests_table)
    monkeypatch.setenv("MDCLIENT_CATALOG_NAME", e.catalog_name)
    argv = ["status", request_id, "--catalog-uri", e.catalog_uri, "--s3-endpoint", e.s3_endpoint]
    if e.warehouse:
        argv += ["--warehouse", e.warehouse]
    if request_id in ("r-ok", "r-bad"):  # an outcome: the catalog alone, no relay runs
        argv += [
            "--request-endpoint",
            "tcp://127.0.0.1:9",
            "--market-data-endpoint",
            "tcp://127.0.0.1:9",
        ]
    else:  # no outcome: the relay tells an accepted id from one it never saw
        fake_relay.accepted["r-acked"] = SubmitResponse(request_id="r-acked", status=Status.OK)
        argv += ["--request-endpoint", fake_relay.request_endpoint,
                 "--market-data-endpoint", fake_relay.market_data_endpoint]  # fmt: skip
    assert main(argv) == code
    out = capsys.readouterr().out
    assert shown in out
    if request_id == "r-bad":
        assert "bad_symbol: binance does not have market symbol NOPE/USDT" in out


@pytest.mark.parametrize(
    ("missing", "verify", "code"),
    [(0, True, ExitCode.OK), (30, False, ExitCode.OK), (30, True, ExitCode.INCOMPLETE)],
)
def test_cli_history_shows_the_integrity_report_and_verify_fails_on_missing_candles(
    fake_relay: Any, kit: Any, seeded: Any, capsys: Any, monkeypatch: Any,
    missing: int, verify: bool, code: int,
) -> None:  # fmt: skip
    e = seeded["endpoints"]
    base = _notify_with(kit, seeded, seeded["first_snapshot"])

    def with_report(message: Any) -> Any:
        action = base(message)
        for _topic, note in action.publish:
            note.row_count, note.expected_candles = 90, 120
            note.exchange_gaps, note.missing_candles = 30 - missing, missing
            note.source = HistorySource.SOURCE_EXCHANGE
        return action

    fake_relay.handler = with_report
    monkeypatch.setenv("MDCLIENT_S3_ACCESS_KEY", e.s3_access_key)
    monkeypatch.setenv("MDCLIENT_S3_SECRET_KEY", e.s3_secret_key)
    monkeypatch.setenv("MDCLIENT_CATALOG_NAME", e.catalog_name)
    argv = [
        "history", BTC, "--start", "2026-11-20T00:00", "--end", "2026-11-20T02:00",
        "--request-endpoint", fake_relay.request_endpoint,
        "--market-data-endpoint", fake_relay.market_data_endpoint,
        "--catalog-uri", e.catalog_uri, "--s3-endpoint", e.s3_endpoint, "--no-table",
        *(["--warehouse", e.warehouse] if e.warehouse else []),
        *(["--verify"] if verify else []),
    ]  # fmt: skip
    assert main(argv) == code
    err = " ".join(capsys.readouterr().err.split())  # rich wraps stderr at the console width
    shown = "none missing" if not missing else f"{missing} missing"
    assert f"integrity: 120 candle slots: 90 rows, {30 - missing} without trades" in err
    assert shown in err and "from the exchange" in err
    if code == ExitCode.INCOMPLETE:
        assert "incomplete: 30 candles missing" in err


# --- market.markets ----------------------------------------------------------------------------

# market.markets as the pipeline writes it (docs/protocol.md, "Iceberg tables")
_MARKET_NUMBERS = (
    "price_precision", "amount_precision", "min_amount", "max_amount", "min_price",
    "max_price", "min_cost",
)  # fmt: skip
MARKETS_SCHEMA = pa.schema(
    [
        pa.field("ticker", pa.string()),
        pa.field("exchange", pa.string()),
        pa.field("symbol", pa.string()),
        pa.field("base", pa.string()),
        pa.field("quote", pa.string()),
        pa.field("active", pa.bool_()),
        *(pa.field(name, pa.float64()) for name in _MARKET_NUMBERS),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)


def _market(ticker: str, active: bool = True, min_amount: float = 0.0) -> dict[str, Any]:
    exchange, _, symbol = ticker.partition(":")
    base, _, quote = symbol.partition("/")
    return {
        "ticker": ticker, "exchange": exchange, "symbol": base + quote, "base": base,
        "quote": quote, "active": active, "price_precision": 0.01, "amount_precision": 1e-05,
        "min_amount": min_amount, "max_amount": 9000.0, "min_price": 0.0, "max_price": 0.0,
        "min_cost": 5.0, "updated_at": datetime(2026, 11, 20, tzinfo=UTC),
    }  # fmt: skip


@pytest.fixture(scope="module")
def markets_table(seeded: dict[str, Any]) -> str:
    catalog = load_catalog(seeded["catalog_name"], **seeded["props"])
    name: str = seeded["table"].replace(".ohlc", ".markets")
    table = catalog.create_table(name, schema=MARKETS_SCHEMA)
    table.append(
        pa.Table.from_pylist(
            [
                _market("BINANCE:ETH/USDT", min_amount=0.001),
                _market("BINANCE:BTC/USDT", min_amount=0.0001),
                _market("BINANCE:LUNA/USDT", active=False),
                _market("KRAKEN:SOL/EUR"),
            ],
            schema=MARKETS_SCHEMA,
        )
    )
    return name


def test_sdk_reads_one_exchanges_markets(fake_relay: Any, seeded: Any, markets_table: str) -> None:
    settings = _stack_settings(fake_relay, seeded, markets_table=markets_table)
    with Client(settings=settings) as client:
        rows = client.markets("binance").to_pylist()
        assert client.markets("COINBASE").num_rows == 0
        with pytest.raises(InvalidRequest):
            client.markets("not an exchange")
    assert [(r["ticker"], r["active"]) for r in rows] == [
        ("BINANCE:BTC/USDT", True),
        ("BINANCE:ETH/USDT", True),
        ("BINANCE:LUNA/USDT", False),
    ]
    assert rows[0]["min_amount"] == 0.0001 and rows[0]["min_cost"] == 5.0


def _markets_cli(seeded: Any, table: str, *extra: str) -> int:
    e = seeded["endpoints"]
    return main(
        [
            "markets", *extra,
            "--catalog-uri", e.catalog_uri, "--warehouse", e.warehouse,
            "--s3-endpoint", e.s3_endpoint,
        ]
    )  # fmt: skip


def test_cli_prints_an_exchanges_markets(
    seeded: Any, markets_table: str, capsys: Any, monkeypatch: Any
) -> None:
    e = seeded["endpoints"]
    monkeypatch.setenv("MDCLIENT_CATALOG_NAME", e.catalog_name)
    monkeypatch.setenv("MDCLIENT_MARKETS_TABLE", markets_table)
    monkeypatch.setenv("MDCLIENT_S3_ACCESS_KEY", e.s3_access_key)
    monkeypatch.setenv("MDCLIENT_S3_SECRET_KEY", e.s3_secret_key)
    monkeypatch.setenv("MDCLIENT_S3_REGION", e.s3_region)

    assert _markets_cli(seeded, markets_table, "BINANCE") == ExitCode.OK
    out = capsys.readouterr().out
    assert "BINANCE: 3 markets" in out
    btc = next(line for line in out.splitlines() if "BINANCE:BTC/USDT" in line).split()
    assert btc[1:6] == ["yes", "0.01", "1e-05", "0.0001", "9000"]
    assert "KRAKEN" not in out

    assert _markets_cli(seeded, markets_table, "BINANCE", "--active") == ExitCode.OK
    assert "LUNA" not in capsys.readouterr().out
    assert _markets_cli(seeded, markets_table, "COINBASE") == ExitCode.NOT_FOUND
    assert "no markets of COINBASE" in capsys.readouterr().err

    monkeypatch.setenv("MDCLIENT_MARKETS_TABLE", "nope_ns.markets")
    assert _markets_cli(seeded, markets_table, "BINANCE") == ExitCode.STORAGE
    err = capsys.readouterr().err
    assert "does not exist yet" in err and "no_table" in err


# --- live: sequence gaps against the real pipeline publisher, recovery from real Iceberg ---


def _last_value(endpoint: str, topic: str) -> Any:
    """What a fresh SUB of `topic` receives at once: the pipeline's last value (no publish)."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    try:
        return envelope.decode_sub(sub.recv_multipart())[1]
    finally:
        sub.close(0)


def _last_value_after(endpoint: str, topic: str, sequence: int, timeout_s: float = 10.0) -> Any:
    """The last value once the server has taken in `sequence`: publishing is a PUSH to the
    server's thread, so a subscriber racing it may still see the previous value."""
    deadline = time.monotonic() + timeout_s
    while (value := _last_value(endpoint, topic)).sequence < sequence:
        assert time.monotonic() < deadline, f"last value still {value.sequence} < {sequence}"
        time.sleep(0.02)
    return value


def _candle(close: float, open_ms: int, *, closed: bool = False) -> OHLC:
    return OHLC(ticker=BTC, period_seconds=60, open_time_ms=open_ms, close=close, closed=closed)


def _next(stream: Any, until: Callable[[Any], bool], timeout_s: float = 30.0) -> list[Any]:
    """Messages from the stream up to and including the first that satisfies `until`."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = stream.get(0.25)
        if message is not None:
            got.append(message)
            if until(message):
                return got
    raise AssertionError(f"no matching message within {timeout_s} s; got {got}")


def test_live_late_join_gets_the_last_value_and_a_gap_is_recovered_from_iceberg(
    fake_relay: Any, seeded: Any
) -> None:
    """The SDK on the pipeline's real XPUB: joins late (last value), misses three messages
    (two closed candles among them), reports the gap, reads the lost closed candles from
    Iceberg and delivers every closed candle exactly once."""
    server = PubServer(
        PipelineSettings.model_validate(
            {
                "pub_endpoint": "tcp://127.0.0.1:*",
                "live": {"enabled": False},
                "cep": {"enabled": False},
            }
        )
    )
    endpoint = server.start()
    publisher = Publisher(server.pull_endpoint, endpoint)
    topic = topics.ohlc_topic(BTC, 60)
    settings = _stack_settings(fake_relay, seeded).model_copy(
        update={"market_data_endpoint": endpoint, "ohlc_table": seeded["table"]}
    )
    events: list[SequenceEvent] = []
    try:
        publisher.publish(topic, _candle(1.0, T0))
        publisher.publish(topic, _candle(2.0, T0))
        publisher.publish(topics.tick_topic(ETH), Tick(ticker=ETH, trade_id="e1"))
        assert _last_value_after(endpoint, topic, 2).sequence == 2  # the server has both
        assert _last_value_after(endpoint, topics.tick_topic(ETH), 1).trade_id == "e1"
        with Client(settings=settings) as client:
            stream = client.live(BTC, ohlc=["1m"], on_sequence=events.append)
            joined = stream.get(5)  # nothing published since: the last value
            assert isinstance(joined, OHLC) and (joined.sequence, joined.close) == (2, 2.0)
            publisher.publish(topic, _candle(3.0, T0, closed=True))
            assert _next(stream, lambda m: m.closed)[-1].sequence == 3

            # The client misses the next three: its subscription is withdrawn. A
            # later subscription on the same connection being answered proves the
            # withdrawal reached the XPUB (it handles them in order).
            client.unsubscribe(topic)
            probe = client.live(ETH, ticks=True)
            assert probe.get(5) is not None
            publisher.publish(topic, _candle(4.0, T0 + MINUTE, closed=True))
            publisher.publish(topic, _candle(5.0, T0 + 2 * MINUTE, closed=True))
            publisher.publish(topic, _candle(6.0, T0 + 3 * MINUTE))
            assert _last_value_after(endpoint, topic, 6).sequence == 6
            client.subscribe(topic)  # back: the last value (6) reveals the gap

            got = _next(stream, lambda m: m.closed and m.open_time_ms == T0 + 119 * MINUTE)
            deadline = time.monotonic() + 10
            while not any(e.kind == "recovered" for e in events):
                assert time.monotonic() < deadline, events
                time.sleep(0.05)
            publisher.publish(topic, _candle(7.0, T0 + 3 * MINUTE, closed=True))  # recovered
            publisher.publish(topic, _candle(8.0, T0 + 4 * MINUTE))
            got += _next(stream, lambda m: m.sequence == 8)
            probe.close()
    finally:
        publisher.close()
        server.stop()

    assert [(e.kind, e.missed) for e in events] == [("gap", 2), ("recovered", 0)]
    assert events[0].topic == topic and events[1].candles == 119  # T0+1m .. T0+119m stored
    assert (got[0].sequence, got[0].open_time_ms, got[0].closed) == (6, T0 + 3 * MINUTE, False)
    closed = [m for m in got if m.closed]
    assert [m.open_time_ms for m in closed] == [T0 + i * MINUTE for i in range(1, 120)]
    assert closed[0].trade_count == 101  # the stored candle, not the lost live one
    assert stream.duplicates == 1  # closed T0+3m, published live after it was recovered
    assert (stream.gaps, stream.missed) == (1, 2)
