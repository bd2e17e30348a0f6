"""Live data follows what clients subscribe to on :5558.

    subscription tap -> LiveSubscriptions (relay/subscriptions.py)
        first subscriber -> Ingestors.announce (DataRequest{REALTIME} on :5555)
        last one gone + grace -> Ingestors.cancel (IngestorControl{CANCEL_REALTIME} on :5560)
        tickers with CEP triggers are pinned live while their triggers exist
    FeedStatus (ingestors, or the relay's own refusals) -> StatusBoard -> tap -> {ticker}|status

Loop thread only. The decisions are in the pure modules (subscriptions.py,
feedstatus.py); this module turns them into messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mdproto import envelope
from mdproto.error_codes import BAD_SYMBOL
from mdproto.messages import FeedStatus
from mdproto.topics import parse_market_topic, status_topic
from relay.config import RelaySettings
from relay.feedstatus import StatusBoard, state_name, status_ticker
from relay.ingestors import Ingestors
from relay.metrics import RelayMetrics
from relay.sockets import MarketDataProxy, parse_subscription
from relay.subscriptions import Action, Announce, LiveSubscriptions

log = logging.getLogger(__name__)


class LiveFeeds:
    def __init__(
        self,
        settings: RelaySettings,
        metrics: RelayMetrics,
        ingestors: Ingestors,
        proxy: MarketDataProxy,
        *,
        check_symbol: Callable[[str], str | None],
        trigger_tickers: Callable[[], set[str]] | None,
        wall_ms: Callable[[], int],
        new_id: Callable[[], str],
        now: float,
    ) -> None:
        s = settings
        self._metrics = metrics
        self._ingestors = ingestors
        self._proxy = proxy
        self._check_symbol = check_symbol
        self._trigger_tickers = trigger_tickers
        self._wall_ms = wall_ms
        self._pinned: set[str] = set()  # tickers kept live because they have triggers
        self._live = LiveSubscriptions(
            grace=s.realtime_grace_s,
            refresh=s.realtime_refresh_s,
            known_exchanges=s.known_exchanges,
            new_id=new_id,
            now=now,
            live_periods=s.live_periods,
        )
        self._status = StatusBoard(live_periods=s.live_periods, repeat_s=s.status_repeat_s, now=now)

    def next_deadline(self) -> float:
        deadline = self._status.next_deadline()
        live = self._live.next_deadline()
        return live if deadline is None else min(live, deadline)

    def due(self, now: float) -> None:
        """Cancel feeds whose grace ran out, refresh leases, repeat bad statuses."""
        self._apply(self._live.due(now))
        for status in self._status.due(now):
            self._publish_status(status, "repeat")

    # --- client subscriptions (the tap) and ingestors joining ------------------------

    def on_subscription(self, frames: list[bytes], now: float) -> None:
        event = parse_subscription(frames)
        if event is None:
            return
        subscribe, topic = event
        self._metrics.subscription_events.labels("subscribe" if subscribe else "unsubscribe").inc()
        log.debug("%s %r", "subscribe" if subscribe else "unsubscribe", topic)
        if subscribe:
            self._status_on_subscribe(topic)
            self._apply(self._live.subscribed(topic, now))
        else:
            self._status.unsubscribed(topic)
            self._apply(self._live.unsubscribed(topic, now))
        self._metrics.subscribed_topics.set(self._live.topic_count)

    def ingestor_joined(self, prefix: str) -> None:
        """Tell an ingestor that just subscribed which of its tickers are live."""
        self._apply(self._live.ingestor_joined(prefix))

    def sync_trigger_tickers(self, now: float) -> None:
        """Keep tickers with triggers live (the ingestor must stream them for the pipeline
        to evaluate), and let them go once their last trigger is gone."""
        if self._trigger_tickers is None:
            return
        wanted = self._trigger_tickers()
        if wanted == self._pinned:
            return
        for ticker in sorted(wanted - self._pinned):
            self._apply(self._live.pin(ticker, now))
        for ticker in sorted(self._pinned - wanted):
            self._apply(self._live.unpin(ticker, now))
        self._pinned = wanted

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if not isinstance(action, Announce) or action.why == "start":
                self._status.forget(action.ticker)  # a new feed, or none: old state is moot
            if isinstance(action, Announce):
                self._ingestors.announce(action)
            else:
                self._ingestors.cancel(action)
        if actions:
            self._metrics.live_tickers.set(len(self._live.live_tickers))

    # --- live feed statuses (`{ticker}|status`) --------------------------------------

    def on_feed_status(self, status: FeedStatus, now: float) -> None:
        """An ingestor reports a feed's state: keep it (live tickers only) and publish it."""
        live = self._live.is_live(status.ticker)
        self._status.record(status, live=live)
        healthy = status.state in (FeedStatus.STARTED, FeedStatus.RECOVERED)
        log.log(
            logging.INFO if healthy else logging.WARNING,
            "live feed %s %s%s (ingestor %s)%s",
            status.ticker,
            state_name(status),
            f": {status.error_code}: {status.reason}" if status.error_code else "",
            status.ingestor_id or "-",
            "" if live else "; the ticker is not live here",
        )
        self._publish_status(status, "ingestor")

    def _status_on_subscribe(self, topic: str) -> None:
        """Refuse an unsupported candle period or an unknown symbol; tell a `{ticker}|status`
        subscriber the state."""
        refusal = self._status.refuse(topic, self._wall_ms())
        if refusal is not None:
            log.info("live subscription %r refused: %s", topic, refusal.reason)
            self._publish_status(refusal, "relay")
        market = parse_market_topic(topic)
        problem = self._check_symbol(market.ticker) if market is not None else None
        if market is not None and problem is not None:
            # The ingestor would say the same after a round trip to the exchange.
            log.info("live subscription %r: %s", topic, problem)
            failed = FeedStatus(
                ticker=market.ticker,
                state=FeedStatus.FAILED,
                error_code=BAD_SYMBOL,
                reason=problem,
                at_ms=self._wall_ms(),
            )
            self._publish_status(failed, "relay")
        ticker = status_ticker(topic)
        for status in self._status.latest(ticker) if ticker else []:
            self._publish_status(status, "replay")

    def _publish_status(self, status: FeedStatus, source: str) -> None:
        sent = self._proxy.publish(envelope.encode_pub(status_topic(status.ticker), status))
        self._metrics.feed_statuses.labels(state_name(status), source if sent else "dropped").inc()
