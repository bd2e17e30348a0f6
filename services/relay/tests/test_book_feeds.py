"""Order-book feeds from `{ticker}|book` subscriptions: their own stream, request_id,
re-announcement, grace and cancel; never the trade feed (docs/protocol.md "Order books")."""

from __future__ import annotations

import itertools
from typing import Any

from mdproto import envelope
from mdproto.messages import DataRequest, IngestorControl
from relay.config import RelaySettings
from relay.ingestors import Ingestors
from relay.metrics import RelayMetrics
from relay.subscriptions import Announce, Cancel, LiveSubscriptions

BTC = "BINANCE:BTC/USDT"
BOOK = f"{BTC}|book"
TICK = f"{BTC}|tick"


def tracker(grace: float = 30.0, refresh: float = 10.0) -> LiveSubscriptions:
    ids = (f"rt{i}" for i in itertools.count(1))
    return LiveSubscriptions(
        grace=grace, refresh=refresh, known_exchanges=["BINANCE"], new_id=lambda: next(ids), now=0.0
    )


def test_a_book_subscription_starts_the_book_feed_only() -> None:
    live = tracker()
    assert live.subscribed(BOOK, 1.0) == [Announce(BTC, "rt1", "start", "book")]
    assert live.subscribed(BOOK, 1.0) == []
    # Trades are another feed, with a request_id of their own.
    assert live.subscribed(TICK, 2.0) == [Announce(BTC, "rt2", "start", "trades")]
    assert live.is_live(BTC) and live.live_tickers == [BTC]


def test_book_feed_is_re_announced_and_cancelled_after_its_grace() -> None:
    live = tracker(grace=30.0, refresh=10.0)
    live.subscribed(BOOK, 1.0)
    live.subscribed(TICK, 1.0)
    assert live.due(10.0) == [
        Announce(BTC, "rt1", "refresh", "book"),
        Announce(BTC, "rt2", "refresh", "trades"),
    ]
    assert live.ingestor_joined("BINANCE:") == [
        Announce(BTC, "rt1", "ingestor joined", "book"),
        Announce(BTC, "rt2", "ingestor joined", "trades"),
    ]
    assert live.unsubscribed(BOOK, 12.0) == []
    assert live.subscribed(BOOK, 20.0) == []  # back within the grace: kept
    live.unsubscribed(BOOK, 25.0)
    actions = live.due(56.0)
    assert Cancel(BTC, "rt1", "book") in actions
    assert not any(isinstance(a, Cancel) and a.kind == "trades" for a in actions)
    assert live.is_live(BTC)  # the trade feed still runs
    assert live.subscribed(BOOK, 60.0) == [Announce(BTC, "rt3", "start", "book")]


def test_unknown_exchange_book_starts_nothing() -> None:
    assert tracker().subscribed("KRAKEN:BTC/USDT|book", 1.0) == []


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        self.sent.append(frames)


def test_ingestors_get_book_requests_and_book_cancels() -> None:
    work, control = FakeSocket(), FakeSocket()
    ingestors = Ingestors(
        RelaySettings(),
        RelayMetrics(),
        lambda key, now: None,
        work,  # type: ignore[arg-type]
        control,  # type: ignore[arg-type]
        clock=lambda: 0.0,
        wall_ms=lambda: 1,
        wake=lambda: None,
    )
    ingestors.announce(Announce(BTC, "rt1", "start", "book"))
    ingestors.announce(Announce(BTC, "rt2", "start"))
    ingestors.cancel(Cancel(BTC, "rt1", "book"))
    requests: list[Any] = [envelope.decode_sub(f)[1] for f in work.sent]
    assert [(r.kind, r.request_id) for r in requests] == [
        (DataRequest.BOOK, "rt1"),
        (DataRequest.REALTIME, "rt2"),
    ]
    (cancel,) = [envelope.decode_sub(f)[1] for f in control.sent]
    assert isinstance(cancel, IngestorControl)
    assert cancel.action == IngestorControl.CANCEL_BOOK and cancel.request_id == "rt1"
