"""Live feed statuses on `{ticker}|status`: the last one per live ticker, and refusals.

The ingestors report a feed's state (FeedStatus from :5556); the relay itself
refuses a candle period the pipeline does not serve. `StatusBoard` keeps what a
client subscribing later must still learn:

- the latest ingestor status of each *live* ticker (forgotten when the ticker
  stops being live or starts afresh), so the state is bounded by live tickers;
- a REFUSED per unsupported `{ticker}|ohlc:{p}` topic while it has subscribers
  (at most `MAX_REFUSALS`: beyond, a refusal is published once and not kept,
  so a client subscribing to thousands of periods cannot multiply the repeats).

The relay's XPUB reports only a topic's *first* subscription, so a second client
watching a failed ticker produces no event: LOST, FAILED and REFUSED are
therefore repeated every `repeat_s` while they hold (STARTED/RECOVERED are not:
the data itself says so). Every held status, STARTED included, is replayed
unchanged on each first subscription (`latest`), which a client that reconnects
makes again: one whose library answers no ZMTP PING is dropped after the
heartbeat timeout and sees its STARTED about every 6 s (docs/protocol.md "Live
feed status"). Pure: the caller passes `now` and the wall time.
"""

from __future__ import annotations

from collections.abc import Iterable

from mdproto import topics
from mdproto.error_codes import UNSUPPORTED_PERIOD
from mdproto.messages import FeedStatus

MAX_REFUSALS = 1024
_REPEATED = frozenset({FeedStatus.LOST, FeedStatus.FAILED, FeedStatus.REFUSED})


def refused_period(topic: str, live_periods: Iterable[int]) -> int | None:
    """The candle period of an `{ticker}|ohlc:{p}` topic when p is not served, else None.

    `{ticker}|ohlc:` (every period) and non-market topics are never refused.
    """
    market = topics.parse_market_topic(topic)
    if market is None or market.period_seconds is None:
        return None
    return None if market.period_seconds in live_periods else market.period_seconds


def state_name(status: FeedStatus) -> str:
    """`FAILED`, ... or `UNKNOWN` for a state this build does not know (logs, metric labels)."""
    known = status.state in FeedStatus.State.values()
    return FeedStatus.State.Name(status.state) if known else "UNKNOWN"


def status_ticker(topic: str) -> str | None:
    """`BINANCE:BTC/USDT` for the subscription `BINANCE:BTC/USDT|status`, else None."""
    ticker, sep, rest = topic.partition("|")
    return ticker if sep and rest == topics.STATUS and ticker else None


class StatusBoard:
    def __init__(self, *, live_periods: Iterable[int], repeat_s: float, now: float) -> None:
        self.live_periods = tuple(sorted(live_periods))
        self._repeat_s = repeat_s
        self._feeds: dict[str, FeedStatus] = {}  # ticker -> latest ingestor status
        self._refused: dict[str, FeedStatus] = {}  # refused topic -> its REFUSED
        self._next_repeat = now + repeat_s

    def __len__(self) -> int:
        return len(self._feeds) + len(self._refused)

    def refuse(self, topic: str, at_ms: int) -> FeedStatus | None:
        """A REFUSED for a subscription to an unsupported period (kept while subscribed)."""
        period = refused_period(topic, self.live_periods)
        if period is None:
            return None
        market = topics.parse_market_topic(topic)
        assert market is not None
        served = ", ".join(str(p) for p in self.live_periods)
        status = FeedStatus(
            ticker=market.ticker,
            state=FeedStatus.REFUSED,
            error_code=UNSUPPORTED_PERIOD,
            reason=f"live candles of {period} s are not served; live periods: {served} s",
            period_seconds=period,
            at_ms=at_ms,
        )
        if len(self._refused) < MAX_REFUSALS:
            self._refused[topic] = status
        return status

    def unsubscribed(self, topic: str) -> None:
        self._refused.pop(topic, None)

    def record(self, status: FeedStatus, *, live: bool) -> None:
        """Keep an ingestor's status as the ticker's latest, if the ticker is live."""
        if live:
            self._feeds[status.ticker] = status
        else:
            self._feeds.pop(status.ticker, None)

    def forget(self, ticker: str) -> None:
        """The ticker stopped being live, or starts a new feed: its old state is moot."""
        self._feeds.pop(ticker, None)

    def latest(self, ticker: str) -> list[FeedStatus]:
        """What a new subscriber to `{ticker}|status` should learn at once."""
        feed = self._feeds.get(ticker)
        refused = [s for s in self._refused.values() if s.ticker == ticker]
        return ([feed] if feed is not None else []) + refused

    def due(self, now: float) -> list[FeedStatus]:
        """Every `repeat_s`: the statuses that still hold and are not visible in the data."""
        if now < self._next_repeat:
            return []
        self._next_repeat = now + self._repeat_s
        return [s for s in [*self._feeds.values(), *self._refused.values()] if s.state in _REPEATED]

    def next_deadline(self) -> float | None:
        if not any(s.state in _REPEATED for s in [*self._feeds.values(), *self._refused.values()]):
            return None
        return self._next_repeat
