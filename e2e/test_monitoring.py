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

JOBS = {"relay", "ingestor", "spark-pipeline", "gateway"}
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
    health: dict[str, str] = {}
    while time.monotonic() < deadline:
        targets = api(base, "targets")["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if set(health) == JOBS and all(h == "up" for h in health.values()):
            break
        time.sleep(1.0)
    assert health == dict.fromkeys(JOBS, "up"), health

    rules = {r["name"] for g in api(base, "rules")["groups"] for r in g["rules"]}
    assert {"NoIngestorForExchange", "PipelineLag", "RelayDrops", "ServiceDown"} <= rules

    # What the "no ingestor" alert reads: the running ingestor serves BINANCE, as seen
    # by each relay (relay and relay-2: the ingestor reports to both).
    served = api(base, "query", query='relay_exchange_served{prefix="BINANCE:"}')["result"]
    assert [float(s["value"][1]) for s in served] == [1.0, 1.0]
    firing = [a["labels"]["alertname"] for a in api(base, "alerts")["alerts"]]
    assert "NoIngestorForExchange" not in firing and "ServiceDown" not in firing
