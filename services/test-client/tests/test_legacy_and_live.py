"""Legacy synchronous call and live streams against the fake relay."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from mdclient import Client, HistoryFailed, HistoryTimeout, RequestTimeout, SubmitRejected
from mdproto import topics
from mdproto.messages import OHLC, OHLCRequest, Response, Status, Tick

TICKER = "BINANCE:BTC/USDT"
START = 1_795_132_800_000
END = START + 3_600_000


def _legacy_requests(relay: Any) -> list[OHLCRequest]:
    return [m for m in relay.requests if isinstance(m, OHLCRequest)]


def test_legacy_returns_sorted_candles(fake_relay: Any, settings_for: Any, kit: Any) -> None:
    fake_relay.handler = kit.legacy_ok
    with Client(settings=settings_for(fake_relay, client_id="legacy1")) as c:
        result = c.fetch_ohlc_sync(TICKER, "1m", START, END, limit=500)
    (request,) = _legacy_requests(fake_relay)
    assert (request.client_id, request.limit, request.period_seconds) == ("legacy1", 500, 60)
    assert result.status == "OK" and result.request_id == request.request_id
    frame = result.to_pandas()
    assert frame["open"].tolist() == [100.0, 101.0, 102.0]
    assert [t.value // 1_000_000 for t in frame["open_time"]] == [
        START,
        START + 60_000,
        START + 120_000,
    ]


def test_legacy_lost_reply_times_out_then_next_call_works(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    """A REQ socket is stuck after a lost reply: the client must recreate it."""
    calls: list[int] = []

    def drop_first(message: Any) -> Any:
        calls.append(1)
        return kit.Action(None) if len(calls) == 1 else kit.legacy_ok(message)

    fake_relay.handler = drop_first
    settings = settings_for(fake_relay, legacy_timeout_s=0.3)
    with Client(settings=settings) as c:
        with pytest.raises(RequestTimeout):
            c.fetch_ohlc_sync(TICKER, "1m", START, END)
        result = c.fetch_ohlc_sync(TICKER, "1m", START, END)
        assert c._transport.requests.resets == 1
    assert len(result) == 3


def test_legacy_retries_with_a_new_request_id_when_configured(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    calls: list[int] = []

    def drop_first(message: Any) -> Any:
        calls.append(1)
        return kit.Action(None) if len(calls) == 1 else kit.legacy_ok(message)

    fake_relay.handler = drop_first
    settings = settings_for(fake_relay, legacy_timeout_s=0.3, legacy_attempts=2)
    with Client(settings=settings) as c:
        result = c.fetch_ohlc_sync(TICKER, "1m", START, END)
    first, second = _legacy_requests(fake_relay)
    assert first.request_id != second.request_id == result.request_id
    assert result.attempts == 2


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (Status.ERROR, HistoryFailed),
        (Status.TIMEOUT, HistoryTimeout),
        (Status.REJECTED, SubmitRejected),
    ],
)
def test_legacy_failure_statuses_raise_typed_errors(
    fake_relay: Any, settings_for: Any, kit: Any, status: int, error: type[Exception]
) -> None:
    fake_relay.handler = lambda m: kit.Action(
        Response(request_id=m.request_id, status=status, reason="why not", error_code="nope")
    )
    with Client(settings=settings_for(fake_relay)) as c, pytest.raises(error) as info:
        c.fetch_ohlc_sync(TICKER, "1m", START, END)
    assert info.value.reason == "why not"  # type: ignore[attr-defined]
    assert info.value.error_code == "nope"  # type: ignore[attr-defined]


def test_legacy_not_found_is_an_empty_frame(fake_relay: Any, settings_for: Any, kit: Any) -> None:
    fake_relay.handler = lambda m: kit.Action(
        Response(request_id=m.request_id, status=Status.NOT_FOUND)
    )
    with Client(settings=settings_for(fake_relay)) as c:
        result = c.fetch_ohlc_sync(TICKER, "1m", START, END)
    assert result.status == "NOT_FOUND" and result.empty


def _tick(ticker: str, trade_id: str) -> Tick:
    return Tick(ticker=ticker, trade_id=trade_id, price=100.5, amount=0.1, timestamp_ms=START)


def test_live_iterator_yields_exactly_the_subscribed_topics(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    tick_topic = topics.tick_topic(TICKER)
    ohlc_topic = topics.ohlc_topic(TICKER, 60)
    with Client(settings=settings_for(fake_relay, notify="per_request")) as c:
        stream = c.live(TICKER, ticks=True, ohlc=["1m"])
        fake_relay.wait_for(lambda ev: {("sub", tick_topic), ("sub", ohlc_topic)} <= set(ev))
        assert fake_relay.subscriptions() == [topics.status_topic(TICKER), tick_topic, ohlc_topic]
        # ohlc:600 is prefix-matched by the ohlc:60 subscription: must be filtered out.
        fake_relay.publish(topics.ohlc_topic(TICKER, 600), kit.candle(TICKER, 600, START, 1.0))
        fake_relay.publish(topics.tick_topic("BINANCE:ETH/USDT"), _tick("BINANCE:ETH/USDT", "x"))
        fake_relay.publish(tick_topic, _tick(TICKER, "t1"))
        fake_relay.publish(ohlc_topic, kit.candle(TICKER, 60, START, 2.0))
        fake_relay.publish(tick_topic, _tick(TICKER, "t2"))
        received = [next(stream) for _ in range(3)]
        assert stream.get(timeout_s=0.3) is None  # nothing else arrives
        stream.close()
        assert list(stream) == []
        fake_relay.wait_for(lambda ev: ("unsub", tick_topic) in ev and ("unsub", ohlc_topic) in ev)
    assert isinstance(received[0], Tick) and received[0].trade_id == "t1"
    assert isinstance(received[1], OHLC) and received[1].period_seconds == 60
    assert isinstance(received[2], Tick) and received[2].trade_id == "t2"


def test_live_ohlc_only_does_not_subscribe_ticks(fake_relay: Any, settings_for: Any) -> None:
    with (
        Client(settings=settings_for(fake_relay, notify="per_request")) as c,
        c.live(TICKER, ohlc=[300]) as stream,
    ):
        want = [topics.status_topic(TICKER), topics.ohlc_topic(TICKER, 300)]
        assert list(stream.topics) == want
        fake_relay.wait_for(lambda ev: ("sub", topics.ohlc_topic(TICKER, 300)) in ev)
        assert fake_relay.subscriptions() == want  # the status topic first


def test_live_callback_api(fake_relay: Any, settings_for: Any) -> None:
    got: list[Any] = []
    done = threading.Event()

    def on_message(message: Any) -> None:
        got.append(message)
        if len(got) == 2:
            done.set()

    with Client(settings=settings_for(fake_relay)) as c:
        handle = c.on_live(TICKER, on_message)
        fake_relay.publish(topics.tick_topic(TICKER), _tick(TICKER, "a"))
        fake_relay.publish(topics.tick_topic(TICKER), _tick(TICKER, "b"))
        assert done.wait(5)
        handle.close()
    assert [m.trade_id for m in got] == ["a", "b"]


def test_live_queue_drops_oldest_when_consumer_lags() -> None:
    from mdclient.live import LiveStream

    stream = LiveStream(["t"], lambda s: None, maxsize=2)
    for i in range(5):
        stream.deliver(_tick(TICKER, str(i)))
    assert stream.dropped == 3
    assert [stream.get(0.1).trade_id, stream.get(0.1).trade_id] == ["3", "4"]  # type: ignore[union-attr]


def test_a_full_live_queue_keeps_closed_candles_and_reports_one_it_must_drop() -> None:
    from mdclient.dispatch import SequenceEvent
    from mdclient.live import LiveStream

    events: list[SequenceEvent] = []
    stream = LiveStream(["t"], lambda s: None, maxsize=3, on_sequence=events.append)

    def candle(minute: int, closed: bool) -> OHLC:
        return OHLC(ticker=TICKER, period_seconds=60, open_time_ms=START + minute * 60_000,
                    close=1.0, closed=closed)  # fmt: skip

    for message in (candle(0, True), candle(1, False), _tick(TICKER, "t"), candle(1, True)):
        stream.deliver(message)  # full at the 4th: the preview goes, not the closed candle
    stream.deliver(candle(2, True))  # the tick goes
    assert (stream.dropped, stream.dropped_closed, events) == (2, 0, [])
    stream.deliver(candle(3, True))  # nothing but closed candles left: one goes, reported
    assert (stream.dropped, stream.dropped_closed) == (2, 1)
    assert [(e.kind, e.missed) for e in events] == [("overflow", 1)]
    assert "dropped unread" in events[0].describe()
    left = [stream.get(0.1) for _ in range(3)]
    assert [(m.open_time_ms - START) // 60_000 for m in left] == [1, 2, 3]  # type: ignore[union-attr]
