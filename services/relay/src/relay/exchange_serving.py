"""The relay's word on who serves each exchange, for clients waiting on a request.

    Ingestors (liveness verdict per work prefix) -> ExchangeServingReports
        -> ExchangeServing on `INGESTORS:{exchange}|status` (market-data XPUB :5558)

A history request accepted just before the last ingestor of its exchange died or
hung would otherwise wait the client's whole history timeout: nobody is left to
fetch it or take its claim over. So every refresh (`stats_interval_s`, 1 s) the
relay publishes, per exchange an ingestor has served since the relay started,
whether a live ingestor still serves it; the SDK watches its request's exchange
and ends the wait on `served` false (`no_ingestor`, with the reason). One message
per exchange for every waiting client, no per-request state. While another
ingestor of the exchange is alive the exchange stays served: that ingestor takes
the request's claim over (docs/protocol.md "Ingestor claims"), nothing ends.

Served reports are published too, so that with active/active relays a relay that
only lost its own link to the ingestors is outweighed by one that still hears
them (the client's rule, mdclient.history.ServingView).

`serving_report` is the rule (pure, over `relay.ingestors.Liveness`'s verdict),
unit-tested without sockets; `Ingestors` knows which exchanges were ever served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mdproto import envelope, topics
from mdproto.messages import ExchangeServing
from relay.ingestors import State, Verdict
from relay.metrics import RelayMetrics

Publish = Callable[[list[bytes]], bool]


def serving_report(
    prefix: str, verdict: Verdict, wall_ms: int, interval_ms: int
) -> ExchangeServing:
    """What to publish for `prefix` ("BINANCE:") given its verdict now.

    `served` is true while a live ingestor reports the exchange (its breaker open
    or Kafka down included: that ingestor ends the request itself, ERROR marker).
    Only exchanges served at some moment since the relay started are reported
    (`Ingestors.served_once_verdicts`): for any other this relay accepted nothing,
    and a report would only end requests another relay, one that does hear their
    ingestors, accepted.
    """
    served = verdict.state is not State.UNSERVED
    return ExchangeServing(
        exchange=prefix.removesuffix(":"),
        served=served,
        alive=verdict.alive,
        error_code="" if served else verdict.error_code,
        reason="" if served else f"relay: {verdict.reason}",
        sent_at_ms=wall_ms,
        interval_ms=interval_ms,
    )


class ExchangeServingReports:
    """Publishes `ServingReports`' answers on the market-data stream (loop thread)."""

    def __init__(
        self,
        metrics: RelayMetrics,
        publish: Publish,
        *,
        wall_ms: Callable[[], int],
        report_interval_s: float = 1.0,
    ) -> None:
        self._metrics = metrics
        self._publish = publish
        self._wall_ms = wall_ms
        self._interval_ms = max(1, round(report_interval_s * 1000))

    def refresh(self, verdicts: Iterable[tuple[str, Verdict]]) -> None:
        """One report per exchange served since start (the loop calls this every
        `stats_interval_s` with `Ingestors.served_once_verdicts`)."""
        wall_ms = self._wall_ms()
        for prefix, verdict in verdicts:
            report = serving_report(prefix, verdict, wall_ms, self._interval_ms)
            topic = topics.ingestors_status_topic(report.exchange)
            sent = self._publish(envelope.encode_pub(topic, report))
            if sent and not report.served:
                self._metrics.ingestor_down_reports.labels(prefix).inc()
