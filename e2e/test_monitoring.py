"""Prometheus of the compose `monitoring` profile sees every service and its alerts."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from infra.compose_platform import ComposePlatform

pytestmark = [pytest.mark.e2e, pytest.mark.compose]

#: live-engine: the replicas of the scaled service, found by Docker DNS (1 by default).
JOBS = {"relay", "ingestor", "spark-pipeline", "gateway", "live-engine"}
WAIT_S = 120.0


def api(base: str, path: str, **query: str) -> Any:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def test_prometheus_scrapes_every_service_and_loads_the_alert_rules(
    compose: ComposePlatform,
) -> None:
    base = compose.endpoints.prometheus_url
    deadline = time.monotonic() + WAIT_S
    targets: list[tuple[str, str, str]] = []
    while time.monotonic() < deadline:
        targets = [
            (t["labels"]["job"], t["labels"]["instance"], t["health"])
            for t in api(base, "targets")["activeTargets"]
        ]
        if {job for job, _, _ in targets} == JOBS and all(h == "up" for *_, h in targets):
            break
        time.sleep(1.0)
    # Every target, not one per job: a scaled service has one per replica.
    assert {job for job, _, _ in targets} == JOBS, targets
    assert all(h == "up" for *_, h in targets), targets

    rules = {r["name"] for g in api(base, "rules")["groups"] for r in g["rules"]}
    assert {"NoIngestorForExchange", "PipelineLag", "RelayDrops", "ServiceDown"} <= rules

    # What the "no ingestor" alert reads: the running ingestor serves BINANCE, as seen
    # by each relay (relay and relay-2: the ingestor reports to both).
    served = api(base, "query", query='relay_exchange_served{prefix="BINANCE:"}')["result"]
    assert [float(s["value"][1]) for s in served] == [1.0, 1.0]
    # Both engines' series: the pipeline's own (its /metrics) and the replica's.
    owned = api(base, "query", query="sum by (job) (pipeline_live_partitions_owned)")["result"]
    assert {o["metric"]["job"] for o in owned} == {"spark-pipeline", "live-engine"}, owned
    assert "LiveEngineLagGrowing" in rules
    # An earlier test may have killed a part: its alert resolves once it is back.
    outage_alerts = {"NoIngestorForExchange", "ServiceDown"}
    raised: list[dict[str, str]] = []
    alerts_deadline = time.monotonic() + WAIT_S
    while time.monotonic() < alerts_deadline:
        raised = [
            a["labels"]
            for a in api(base, "alerts")["alerts"]
            if a["labels"]["alertname"] in outage_alerts
        ]
        if not raised:
            break
        time.sleep(1.0)
    assert raised == [], raised
