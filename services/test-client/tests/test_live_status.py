"""Live streams and `{ticker}|status`: FAILED/REFUSED end a stream, LOST/RECOVERED are told."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mdclient import Client, FeedRefused, FeedUnavailable
from mdclient.live import LiveStream, concerns, feed_error
from mdproto import topics
from mdproto.messages import FeedStatus, Tick

TICKER = "BINANCE:BTC/USDT"
STATUS = topics.status_topic(TICKER)


def status(state: int, code: str = "", period: int = 0, reason: str = "") -> FeedStatus:
    return FeedStatus(
        ticker=TICKER,
        state=state,
        error_code=code,
        period_seconds=period,
        reason=reason,  # type: ignore[arg-type]
    )


def test_a_failed_feed_raises_from_the_iterator_within_seconds(
    fake_relay: Any, settings_for: Any
) -> None:
    with Client(settings=settings_for(fake_relay)) as c, c.live(TICKER) as stream:
        fake_relay.wait_for(lambda ev: ("sub", topics.tick_topic(TICKER)) in ev)
        fake_relay.publish(topics.tick_topic(TICKER), Tick(ticker=TICKER, trade_id="1"))
        published_at = time.monotonic()
        fake_relay.publish(STATUS, status(FeedStatus.FAILED, "bad_symbol", reason="no NOPE"))
        assert next(stream).trade_id == "1"  # what came before is still delivered
        with pytest.raises(FeedUnavailable) as failure:
            next(stream)
        assert time.monotonic() - published_at < 2.0
        assert stream.closed  # unsubscribed on the way out
    error = failure.value
    assert not isinstance(error, FeedRefused)
    assert (error.error_code, error.state, error.ticker) == ("bad_symbol", "FAILED", TICKER)
    assert "no NOPE" in str(error) and stream.error is error


def test_refused_ends_only_the_streams_that_asked_for_that_period(
    fake_relay: Any, settings_for: Any
) -> None:
    with Client(settings=settings_for(fake_relay)) as c:
        ticks = c.live(TICKER, ticks=True)
        candles = c.live(TICKER, ohlc=["15m"])
        fake_relay.wait_for(lambda ev: ("sub", topics.ohlc_topic(TICKER, 900)) in ev)
        fake_relay.publish(STATUS, status(FeedStatus.REFUSED, "unsupported_period", 900))
        with pytest.raises(FeedRefused) as refused:
            next(candles)
        assert refused.value.period_seconds == 900
        assert refused.value.error_code == "unsupported_period"
        fake_relay.publish(topics.tick_topic(TICKER), Tick(ticker=TICKER, trade_id="2"))
        assert next(ticks).trade_id == "2" and ticks.error is None
        ticks.close()


def test_lost_and_recovered_reach_on_status_once_each(fake_relay: Any, settings_for: Any) -> None:
    seen: list[FeedStatus] = []
    with Client(settings=settings_for(fake_relay)) as c, c.live(TICKER, on_status=seen.append) as s:
        fake_relay.wait_for(lambda ev: ("sub", topics.tick_topic(TICKER)) in ev)
        lost = status(FeedStatus.LOST, "network_error")
        for message in (status(FeedStatus.STARTED), lost, lost, status(FeedStatus.RECOVERED)):
            fake_relay.publish(STATUS, message)  # the relay repeats LOST: told once
        fake_relay.publish(topics.tick_topic(TICKER), Tick(ticker=TICKER, trade_id="3"))
        assert next(s).trade_id == "3"  # published after the statuses: they were handled
    assert [m.state for m in seen] == [FeedStatus.STARTED, FeedStatus.LOST, FeedStatus.RECOVERED]
    assert s.error is None


def test_status_rules() -> None:
    refused = status(FeedStatus.REFUSED, "unsupported_period", 900)
    assert concerns(refused, (900,)) and not concerns(refused, (60,))
    assert concerns(status(FeedStatus.FAILED), ())
    assert feed_error(status(FeedStatus.LOST)) is None
    assert isinstance(feed_error(refused), FeedRefused)
    stream = LiveStream([STATUS], lambda _: None, periods=(60,))
    stream.deliver(refused)  # another period's refusal
    assert stream.error is None and stream.status is None


def test_watch_delivers_every_message_of_exactly_its_topic_until_closed(
    fake_relay: Any, settings_for: Any
) -> None:
    import queue

    got: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    with Client(settings=settings_for(fake_relay)) as c:
        handle = c.watch(STATUS, lambda topic, message: got.put((topic, message)))
        fake_relay.wait_for(lambda ev: ("sub", STATUS) in ev)
        lost = status(FeedStatus.LOST, "network_error")
        fake_relay.publish(STATUS + "x", status(FeedStatus.FAILED))  # a prefix match only
        fake_relay.publish(STATUS, lost)
        fake_relay.publish(STATUS, lost)  # raw: repeats are not folded as `live` does
        assert [got.get(timeout=5) for _ in range(2)] == [(STATUS, lost), (STATUS, lost)]
        assert got.empty()
        handle.close()
        handle.close()
        fake_relay.wait_for(lambda ev: ("unsub", STATUS) in ev)
