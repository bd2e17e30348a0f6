"""Prometheus view of the ingestor's own counters, read at scrape time.

The fetch and feed paths keep plain integer stats (IngestorStats, SinkStats,
IntakeStats, FeedStats); this collector turns them into metric families when
Prometheus asks, so observing costs the hot paths nothing and no second set of
counters can drift from the first. Served by mdproto.runtime.metrics_http.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ingestor.clock import wall_clock_ms
from mdproto.messages import TradeGap
from mdproto.runtime.metrics_http import Health

if TYPE_CHECKING:
    from ingestor.app import Ingestor


class IngestorCollector(Collector):
    def __init__(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor

    def collect(self) -> Iterator[Metric]:
        ing = self._ingestor
        stats = ing.stats
        jobs = CounterMetricFamily(
            "ingestor_requests", "Requests this ingestor fetched, by kind", labels=["kind"]
        )
        jobs.add_metric(["history"], stats.history_jobs)
        jobs.add_metric(["legacy"], stats.legacy_jobs)
        yield jobs
        skipped = CounterMetricFamily(
            "ingestor_requests_skipped", "Requests not fetched here, by reason", labels=["reason"]
        )
        skipped.add_metric(["claimed_elsewhere"], stats.skipped_claimed)
        skipped.add_metric(["repeat"], stats.skipped_repeat)
        yield skipped
        yield CounterMetricFamily(
            "ingestor_requests_taken_over",
            "Requests this ingestor took over from a silent claim holder",
            value=stats.taken_over,
        )
        if ing.claims is not None:
            claims = CounterMetricFamily(
                "ingestor_claims_records",
                "Records this ingestor appended to ingest.claims, by kind (failed: not delivered)",
                labels=["kind"],
            )
            c = ing.claims.stats
            claims.add_metric(["takeover_claim"], c.takeovers_claimed)
            claims.add_metric(["heartbeat"], c.heartbeats)
            claims.add_metric(["failed"], c.publish_failures)
            yield claims
        outcomes = CounterMetricFamily(
            "ingestor_history_outcomes",
            "Finished history requests by status and error_code",
            labels=["status", "error_code"],
        )
        for (status, code), count in stats.outcomes.copy().items():
            outcomes.add_metric([status, code], count)
        yield outcomes
        yield CounterMetricFamily(
            "ingestor_history_rows", "Candles written for history requests", value=stats.rows
        )
        yield CounterMetricFamily(
            "ingestor_markets_published",
            "Market metadata records written",
            value=stats.markets_published,
        )
        if ing.sink is not None:
            records = CounterMetricFamily(
                "ingestor_kafka_records", "Kafka records by delivery state", labels=["state"]
            )
            records.add_metric(["produced"], ing.sink.stats.produced)
            records.add_metric(["delivered"], ing.sink.stats.delivered)
            records.add_metric(["failed"], ing.sink.stats.failed)
            yield records
        if ing.intake is not None:
            work = CounterMetricFamily(
                "ingestor_work_messages", "Messages from the relay, by kind", labels=["kind"]
            )
            work.add_metric(["request"], ing.intake.stats.requests)
            work.add_metric(["control"], ing.intake.stats.controls)
            work.add_metric(["malformed"], ing.intake.stats.malformed)
            yield work
        yield from self._feeds()
        yield from self._recording()
        healthy = GaugeMetricFamily(
            "ingestor_exchange_healthy",
            "0 after health.failure_threshold failed exchange calls in a row, until one succeeds",
            labels=["exchange"],
        )
        for e in ing.health.status(ing.ingestor_id, 0, 0).exchanges:
            healthy.add_metric([e.exchange], 1 if e.healthy else 0)
        yield healthy

    def _feeds(self) -> Iterator[Metric]:
        feeds = self._ingestor.feeds
        if feeds is None:
            return
        up = GaugeMetricFamily(
            "ingestor_feed_up", "1 while a live feed runs, 0 once it failed", labels=["ticker"]
        )
        ticks = CounterMetricFamily("ingestor_feed_ticks", "Trades forwarded", labels=["ticker"])
        reconnects = CounterMetricFamily(
            "ingestor_feed_reconnects", "Websocket reconnects", labels=["ticker"]
        )
        gaps = CounterMetricFamily(
            "ingestor_feed_id_gaps", "Trades missing between consecutive ids", labels=["ticker"]
        )
        marked = CounterMetricFamily(
            "ingestor_feed_gaps_marked",
            "Ticks sent with gap_before: trades may be missing before them",
            labels=["ticker"],
        )
        for ticker, (running, s) in feeds.snapshot().items():
            up.add_metric([ticker], 1 if running else 0)
            ticks.add_metric([ticker], s.ticks)
            reconnects.add_metric([ticker], s.reconnects)
            gaps.add_metric([ticker], s.id_gaps)
            marked.add_metric([ticker], s.gaps_marked)
        yield from (up, ticks, reconnects, gaps, marked)

    def _recording(self) -> Iterator[Metric]:
        recorders = self._ingestor.recorders
        if not recorders:
            return
        labels = ["exchange"]
        markets = GaugeMetricFamily(
            "ingestor_recording_markets", "Markets recorded by this ingestor", labels=labels
        )
        universe = GaugeMetricFamily(
            "ingestor_recording_universe", "Markets the exchange's recording names", labels=labels
        )
        unknown = GaugeMetricFamily(
            "ingestor_recording_unknown_markets",
            "Configured markets the exchange does not list (not recorded; logged at start)",
            labels=labels,
        )
        slots = GaugeMetricFamily(
            "ingestor_recording_slots", "Recording slots this ingestor owns", labels=labels
        )
        gaps = GaugeMetricFamily(
            "ingestor_recording_gaps",
            "Gaps of the markets this ingestor has seen, by status",
            labels=[*labels, "status"],
        )
        lag = GaugeMetricFamily(
            "ingestor_recording_repair_lag_seconds",
            "Age of the oldest gap not repaired yet (0: none)",
            labels=labels,
        )
        recovered = CounterMetricFamily(
            "ingestor_recording_trades_recovered", "Trades written by gap repairs", labels=labels
        )
        checkpoints = CounterMetricFamily(
            "ingestor_recording_checkpoints", "RecordingCheckpoint records written", labels=labels
        )
        trades = CounterMetricFamily(
            "ingestor_recording_trades", "Trades the feeds recorded here sent", labels=labels
        )
        now_ms = wall_clock_ms()
        for recorder in recorders.values():
            name = [recorder.prefix]
            markets.add_metric(name, len(recorder.recorded_here()))
            universe.add_metric(name, len(recorder.universe.tickers))
            unknown.add_metric(name, len(recorder.universe.unknown))
            slots.add_metric(name, len(recorder.owned))
            by_status = dict.fromkeys(TradeGap.State.keys()[1:], 0)
            oldest = now_ms
            for gap in recorder.gaps():
                by_status[TradeGap.State.Name(gap.state)] += 1
                if gap.state in (TradeGap.OPEN, TradeGap.REPAIRING):
                    oldest = min(oldest, gap.detected_at_ms)
            for status, count in by_status.items():
                gaps.add_metric([*name, status], count)
            lag.add_metric(name, (now_ms - oldest) / 1000)
            recovered.add_metric(name, recorder.stats.trades_recovered)
            checkpoints.add_metric(name, recorder.stats.checkpoints)
            trades.add_metric(name, recorder.stats.trades)
        yield from (markets, universe, unknown, slots, gaps, lag, recovered, checkpoints, trades)


def registry_for(ingestor: Ingestor) -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(IngestorCollector(ingestor))
    return registry


def health(ingestor: Ingestor) -> Health:
    """Healthy once every part started (Kafka producer, relay sockets), until stop, and
    while no background task died (a restart brings it back). A Kafka outage shows in
    the details but keeps it healthy: a restart would not cure it."""
    feeds = ingestor.feeds.snapshot() if ingestor.feeds is not None else {}
    failed = sorted(t for t, (running, s) in feeds.items() if not running and s.failed)
    sink = ingestor.sink
    return Health(
        ingestor.ready and not ingestor.stopping and not ingestor.failed_tasks,
        {
            "ingestor_id": ingestor.ingestor_id,
            "exchanges": sorted(ingestor.prefixes),
            "live_feeds": len(feeds),
            "failed_feeds": failed,
            "failed_tasks": sorted(ingestor.failed_tasks),
            "kafka_problem": sink.problem if sink is not None else None,
        },
    )
