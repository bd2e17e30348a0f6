"""Config layering, dispatcher routing and output writers (no sockets, no stack)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mdclient.cli.output import candle_table, decimals_for, write_csv, write_parquet
from mdclient.cli.views import live_line
from mdclient.config import load_settings
from mdclient.dispatch import Dispatcher, NotificationWaiter
from mdclient.errors import ConfigError
from mdclient.frames import SCHEMA, candles_from_ohlc, normalise, ohlc_filter
from mdproto import envelope, topics
from mdproto.messages import OHLC, CEPTriggerEvent, HistoryReadyNotification, Status

T0 = 1_795_132_800_000
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONFIG_PATH", raising=False)
    for key in ("MDCLIENT_RELAY_HOST", "MDCLIENT_ATTEMPTS", "MDCLIENT_NOTIFY"):
        monkeypatch.delenv(key, raising=False)


def test_settings_precedence_defaults_yaml_env_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings().request_address == "tcp://127.0.0.1:5559"
    config = tmp_path / "c.yaml"
    config.write_text("relay_host: yaml-host\nattempts: 4\nnotify: per_request\n")
    monkeypatch.setenv("CONFIG_PATH", str(config))
    s = load_settings()
    assert (s.relay_host, s.attempts, s.notify) == ("yaml-host", 4, "per_request")
    assert s.market_data_address == "tcp://yaml-host:5558"
    monkeypatch.setenv("MDCLIENT_ATTEMPTS", "6")
    assert load_settings().attempts == 6
    s = load_settings(attempts=9, relay_host=None)  # None = flag not given
    assert (s.attempts, s.relay_host) == (9, "yaml-host")


def test_explicit_endpoint_beats_host_and_catalog_properties() -> None:
    s = load_settings(
        relay_host="h", request_endpoint="tcp://x:1", s3_access_key="k", warehouse="s3://w"
    )
    assert (s.request_address, s.market_data_address) == ("tcp://x:1", "tcp://h:5558")
    props = s.catalog_properties()
    assert props["type"] == "rest" and props["warehouse"] == "s3://w"
    assert props["s3.access-key-id"] == "k"
    # Unset S3 settings are left to what the catalog hands out (GET /v1/config).
    assert not {"s3.secret-access-key", "s3.endpoint", "s3.region"} & set(props)
    with_endpoint = load_settings(s3_endpoint="http://s3:9000").catalog_properties()
    assert with_endpoint["s3.endpoint"] == "http://s3:9000"
    assert with_endpoint["s3.path-style-access"] == "true"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("relay_hots: x\n", "relay_hots"),  # typo is an error, not a silent default
        ("attempts: 0\n", "attempts"),
        ("- a\n- b\n", "mapping"),
        ("a: [\n", "not valid YAML"),
        ("notify: sometimes\n", "notify"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.yaml")


def _note(request_id: str) -> HistoryReadyNotification:
    return HistoryReadyNotification(request_id=request_id, status=Status.OK)


def test_dispatcher_needs_exact_topic_and_registered_request_id() -> None:
    dispatcher = Dispatcher()
    waiter = NotificationWaiter()
    dispatcher.expect("r1", "RESPONSE:alice", waiter)
    # Prefix-matched foreign topic, unknown id, right id on wrong topic, junk frames:
    dispatcher.handle(envelope.encode_pub("RESPONSE:alice2", _note("r1")))
    dispatcher.handle(envelope.encode_pub("RESPONSE:alice", _note("other")))
    dispatcher.handle(envelope.encode_pub("HISTORY_READY:r1", _note("r1")))
    dispatcher.handle([b"RESPONSE:alice", b"\x09", b"\x12"])
    dispatcher.handle(envelope.encode_pub("RESPONSE:alice", CEPTriggerEvent(trigger_id="t")))
    assert waiter.wait(0.05) is None
    dispatcher.handle(envelope.encode_pub("RESPONSE:alice", _note("r1")))
    got = waiter.wait(1)
    assert got is not None and got.request_id == "r1"
    assert dispatcher.stats["unclaimed_notification"] == 3
    assert (dispatcher.stats["bad_frames"], dispatcher.stats["ignored"]) == (1, 1)
    dispatcher.forget("r1")
    dispatcher.handle(envelope.encode_pub("RESPONSE:alice", _note("r1")))
    assert waiter.wait(0.05) is None


def test_dispatcher_drops_duplicate_notifications_and_reports_lost_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dispatcher = Dispatcher()
    waiter = NotificationWaiter()
    for request_id in ("r1", "r2"):
        dispatcher.expect(request_id, "RESPONSE:alice", waiter)

    def note(request_id: str, seq: int) -> list[bytes]:
        n = HistoryReadyNotification(request_id=request_id, sequence=seq, publisher_epoch=5)
        return envelope.encode_pub("RESPONSE:alice", n)

    dispatcher.handle(note("r1", 1))
    dispatcher.handle(note("r1", 1))  # the same message twice
    dispatcher.handle(note("r2", 4))  # 2 and 3 were lost
    assert [waiter.wait(1).request_id, waiter.wait(1).request_id] == ["r1", "r2"]  # type: ignore[union-attr]
    assert waiter.wait(0.05) is None
    assert (dispatcher.stats["duplicate"], dispatcher.stats["lost"]) == (1, 2)
    assert "2 message(s) lost on RESPONSE:alice" in caplog.text


def test_dispatcher_routes_market_data_by_exact_topic() -> None:
    dispatcher = Dispatcher()
    got: list[Any] = []
    ticker = "BINANCE:BTC/USDT"
    dispatcher.add_sink(topics.ohlc_topic(ticker, 60), got.append)
    for period in (60, 600):
        dispatcher.handle(
            envelope.encode_pub(topics.ohlc_topic(ticker, period), OHLC(period_seconds=period))
        )
    assert [m.period_seconds for m in got] == [60]
    dispatcher.remove_sink(topics.ohlc_topic(ticker, 60), got.append)
    dispatcher.handle(envelope.encode_pub(topics.ohlc_topic(ticker, 60), OHLC()))
    assert len(got) == 1 and dispatcher.stats["unrouted_market"] == 2


def test_ohlc_filter_is_half_open_on_open_time_in_microseconds() -> None:
    text = repr(ohlc_filter("BINANCE:BTC/USDT", 60, T0, T0 + 60_000))
    assert "GreaterThanOrEqual" in text and "LessThan" in text
    assert str(T0 * 1000) in text and str((T0 + 60_000) * 1000) in text


def _frame(n: int, price: float = 100.0) -> pa.Table:
    return candles_from_ohlc(
        OHLC(
            ticker="BINANCE:BTC/USDT",
            period_seconds=60,
            open_time_ms=T0 + i * 60_000,
            open=price + i,
            high=price + i + 2,
            low=price + i - 1,
            close=price + i + 1,
            volume=1.5,
            trade_count=i,
        )
        for i in range(n)
    )


def test_normalise_casts_iceberg_types_and_sorts() -> None:
    wide = _frame(3).cast(
        pa.schema([f.with_type(pa.int64()) if f.name == "period_seconds" else f for f in SCHEMA])
    )
    shuffled = wide.take([2, 0, 1]).append_column("extra", pa.array(["a", "b", "c"]))
    out = normalise(shuffled)
    assert out.schema == SCHEMA
    assert out.column("open").to_pylist() == [100.0, 101.0, 102.0]
    with pytest.raises(ValueError, match="lacks columns"):
        normalise(pa.table({"ticker": ["x"]}))


def test_table_shows_head_and_tail() -> None:
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(candle_table(_frame(50), title="t", max_rows=4))
    text = console.export_text()
    assert "2026-11-20 00:00:00" in text and "2026-11-20 00:01:00" in text
    assert "2026-11-20 00:48:00" in text and "2026-11-20 00:49:00" in text
    assert "00:02:00" not in text and "… 46 more rows" in text
    assert [decimals_for([50_000.0]), decimals_for([2.5]), decimals_for([0.00001])] == [2, 4, 8]


def test_csv_and_parquet_writers(tmp_path: Path) -> None:
    write_csv(_frame(2), tmp_path / "a.csv")
    lines = (tmp_path / "a.csv").read_text().splitlines()
    assert lines[0] == (
        "ticker,period_seconds,open_time,open_time_ms,open,high,low,close,volume,trade_count"
    )
    assert lines[1] == f"BINANCE:BTC/USDT,60,2026-11-20T00:00:00Z,{T0},100.0,102.0,99.0,101.0,1.5,0"
    write_parquet(_frame(2), tmp_path / "a.parquet")
    assert pq.read_table(tmp_path / "a.parquet").equals(_frame(2))


def test_an_unknown_trade_count_is_blank_and_a_zero_stays_zero(tmp_path: Path) -> None:
    from rich.console import Console

    rows = [OHLC(ticker="BINANCE:BTC/USDT", period_seconds=60, open_time_ms=T0, volume=1.5)]
    rows.append(OHLC(ticker="BINANCE:BTC/USDT", period_seconds=60, open_time_ms=T0 + 60_000))
    rows[1].trade_count = 0  # reported: no trades
    frame = candles_from_ohlc(rows)
    assert frame.column("trade_count").to_pylist() == [None, 0]
    write_csv(frame, tmp_path / "a.csv")
    lines = (tmp_path / "a.csv").read_text().splitlines()
    assert lines[1].endswith(",1.5,") and lines[2].endswith(",0.0,0")
    console = Console(width=120, record=True)
    console.print(candle_table(frame, title="t"))
    first, second = [ln for ln in console.export_text().splitlines() if "2026-11-20" in ln]
    assert first.rstrip(" │").endswith("1.5000") and second.rstrip(" │").endswith("0")
    assert live_line(rows[0]).endswith("n ") and live_line(rows[1]).endswith("n 0")


def test_shipped_config_yaml_mirrors_the_built_in_defaults() -> None:
    from mdclient.config import ClientSettings

    shipped = Path(__file__).resolve().parents[1] / "config.yaml"
    assert load_settings(shipped).model_dump() == ClientSettings().model_dump()


def test_live_lines_tell_open_closed_and_corrected_candles_apart() -> None:

    def candle(**flags: bool) -> OHLC:
        return OHLC(ticker="BINANCE:BTC/USDT", period_seconds=60, open_time_ms=T0, **flags)

    assert " open   " in live_line(candle())
    assert " closed " in live_line(candle(closed=True))
    assert " fixed " in live_line(candle(closed=True, correction=True))
    assert "incomplete" not in live_line(candle(closed=True))
    assert live_line(candle(closed=True, incomplete=True)).endswith("  incomplete")


class _ComposeCatalog(BaseHTTPRequestHandler):
    """`GET /v1/config` as compose's catalog answers it: S3 as the network names it."""

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "defaults": {
                    "s3.endpoint": "http://minio:9000",
                    "s3.path-style-access": "true",
                    "s3.access-key-id": "localstack",
                    "s3.secret-access-key": "localstack-secret",
                },
                "overrides": {},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        """Quiet: the test's output is its assertions."""


@pytest.fixture
def compose_catalog() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ComposeCatalog)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("config", "s3_endpoint"),
    [
        ("config.host.yaml", "http://127.0.0.1:8333"),  # the published port wins
        ("config.yaml", "http://minio:9000"),  # inside the network: the network's name
    ],
)
def test_compose_client_configs_reach_s3_where_they_run(
    compose_catalog: str, config: str, s3_endpoint: str
) -> None:
    """docs/docker.md's host command (issue 47: "Could not resolve host: minio"): the
    catalog hands out `http://minio:9000`; what the client's config sets wins over
    those defaults in the catalog pyiceberg builds, so the host config reads S3 on
    its published port."""
    from pyiceberg.catalog import load_catalog

    path = REPO / "infra/compose/test-client" / config
    settings = load_settings(path, catalog_uri=compose_catalog)
    catalog = load_catalog(settings.catalog_name, **settings.catalog_properties())
    assert catalog.properties["s3.endpoint"] == s3_endpoint
    assert catalog.properties["s3.access-key-id"] == "localstack"
