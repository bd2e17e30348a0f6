"""The chart page's script in headless Chromium over the real gateway app and a fake
platform: enum names and error codes shown in words, the gateway's timings shown, the
order book's ladder drawn with its reset and gap visible."""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import GatewaySettings
from gateway.messages import (
    HistoryParams,
    Topic,
    book_event_frame,
    book_frame,
    control_frame,
    message_frame,
    to_dict,
)
from infra.testing import poll_until
from mdclient import HistoryResult, SubmitRejected
from mdclient.frames import candles_from_ohlc
from mdproto.markets import Precision
from mdproto.messages import (
    OHLC,
    BookReset,
    FeedStatus,
    HistoryReadyNotification,
    HistorySource,
    Status,
    TakerSide,
    Tick,
)

T = "BINANCE:BTC/USDT"
NOTIFY_S, CALL_S = 0.15, 0.25  # the fake SDK call: its notification, then its rows read
#: Stands in for lightweight-charts when `make gateway-assets` has not fetched it.
CHART_STUB = """window.LightweightCharts = window.LightweightCharts || {
  CandlestickSeries: {},
  createChart: () => ({ addSeries: () => ({ setData() {}, update() {} }),
                        timeScale: () => ({ fitContent() {} }) }),
};"""


class Handle:
    def close(self) -> None:
        pass


BIDS = [(99.5, 2.0), (99.0, 4.0), (98.5, 1.0)]
ASKS = [(100.0, 1.0), (100.5, 3.0)]
PRECISION = Precision.of(0.01, 0.001)  # the market's tick and lot size


class FakePlatform:
    """What the page meets on a real platform: a feed that is LOST, a sequence gap, a
    trade, a book reset by a checksum and then out of sync, history that took time,
    then a refused submit."""

    def __init__(self) -> None:
        self.failure: Exception | None = None

    def open(
        self, topic: Topic, deliver: Callable[[str], None], fail: Callable[[str, str], None]
    ) -> Handle:
        if topic.kind == "book":
            reset = book_event_frame(topic.name, "reset", reset="BOOK_RESET_CHECKSUM", reason="crc")
            deliver(reset)
            ids = {"exchange_sequence": 7, "exchange_time_ms": 1, "precision": PRECISION}
            deliver(book_frame(topic.name, BIDS, ASKS, in_sync=True, **ids))
            deliver(book_event_frame(topic.name, "gap", reason="sequence gap", missed=2))
            deliver(book_frame(topic.name, BIDS, ASKS, in_sync=False, **ids))
        elif topic.kind == "tick":
            deliver(message_frame(topic.name, Tick(ticker=T, price=2.5, side=TakerSide.BUY)))
            lost = FeedStatus(
                ticker=T, state=FeedStatus.LOST, error_code="network_error", reason="reset"
            )
            deliver(control_frame("feed_status", topic.name, data=to_dict(lost)))
        else:
            deliver(
                control_frame("sequence", topic.name, kind="gap", missed="3", candles=0, reason="")
            )
        return Handle()

    def history(self, params: HistoryParams, timeout_s: float) -> HistoryResult:
        if self.failure is not None:
            raise self.failure
        time.sleep(CALL_S)  # the platform's time, for the gateway to measure
        rows = [OHLC(ticker=T, period_seconds=60, open_time_ms=i * 60_000) for i in range(3)]
        note = HistoryReadyNotification(
            request_id="r1",
            status=Status.OK,
            row_count=3,
            expected_candles=3,
            source=HistorySource.SOURCE_STORAGE_AND_EXCHANGE,
        )
        return HistoryResult(candles_from_ohlc(rows), "OK", "r1", 1, NOTIFY_S, 7, 3, note)


@contextmanager
def serving(platform: FakePlatform) -> Iterator[str]:
    """The gateway app on a free port, its event loop in a thread."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(create_app(GatewaySettings(), upstream=platform))  # type: ignore[arg-type]
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, name="gateway-page-test", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:  # cleaned up on the running loop: the hub's upstream closes finish there
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.skip("chromium and chromedriver are not installed (infra/ci/chromium.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CHART_STUB})
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_shows_words_and_the_gateways_timings(browser: Any) -> None:
    platform = FakePlatform()

    def text(selector: str) -> str:
        return str(
            browser.execute_script(f"return document.querySelector('{selector}').textContent")
        )

    def state() -> dict[str, Any]:
        return dict(browser.execute_script("return window.chartState || {}"))

    with serving(platform) as url:
        browser.get(f"{url}/?ticker={T}&period=60")
        ready = poll_until("history shown", lambda: state().get("ready") and state(), 60)
        poll_until("the feed's state", lambda: state().get("feed") and state().get("trades"), 60)
        poll_until("a sequence event", lambda: state().get("sequenceEvents"), 60)
        book: Any = poll_until(
            "the book's gap", lambda: len(state()["book"]["events"]) == 2 and state()["book"], 60
        )
        assert not ready["errors"], ready["errors"]

        timings = ready["timings"]
        assert timings["notify"] == pytest.approx(NOTIFY_S * 1000)
        assert timings["read"] >= (CALL_S - NOTIFY_S) * 1000 * 0.9
        assert timings["roundTrip"] >= CALL_S * 1000 * 0.9
        status = text("#status")
        assert re.search(r"submit to notification 0\.15 s, rows read \d+\.\d+ s;", status), status

        assert text("#report td[data-key=source]") == "stored, gaps fetched from the exchange"
        assert text("#report td[data-key=status]") == "candles found"
        assert text("#trades tbody td:nth-child(2)") == "buy"
        assert text("#feed") == (
            "connection to the exchange lost, reconnecting: "
            "network error talking to the exchange: reset (network_error)"
        )
        assert text("#sequence") == "3 live messages lost"

        assert book["levels"] == [3, 2] and book["spread"] == 0.5 and not book["inSync"]
        assert [e["kind"] for e in book["events"]] == ["reset", "gap"]
        assert book["events"][0]["text"] == (
            "book rebuilt by the feed: the exchange's checksum disagreed with the book (crc)"
        )
        assert text("#book-event").endswith(
            "book messages lost, waiting for a snapshot (2 messages)"
        )
        assert text("#book-state") == "out of sync, waiting for a snapshot"
        assert text("#spread") == "0.50"  # prices at the tick size: one width a column
        assert text("#asks tr:last-child td") == "100.00"  # the best ask next to the spread
        assert text("#bids tr:first-child td") == "99.50"
        assert text("#bids tr:first-child td:nth-child(2)") == "2.000"  # at the lot size
        classes = browser.execute_script("return [...document.getElementById('ladder').classList]")
        assert "stale" in classes  # (a reset outlines it for 3 s: not asserted, timing)
        aside = text("aside") + text("#book")
        names = [v.name for e in (Status, HistorySource, TakerSide) for v in e.DESCRIPTOR.values]
        names += list(BookReset.keys())
        names += [v.name for v in FeedStatus.State.DESCRIPTOR.values]
        shown = [name for name in names if re.search(rf"\b{name}\b", aside)]
        assert not shown, f"enum names shown as they are: {shown}"

        platform.failure = SubmitRejected("no ingestor for BINANCE", error_code="no_ingestor")
        browser.execute_script("document.getElementById('load').click()")
        failed = poll_until("the refusal shown", lambda: state().get("errors"), 60)
        assert failed[-1] == (
            "history failed: no ingestor serves this exchange: "
            "no ingestor for BINANCE (no_ingestor)"
        )
