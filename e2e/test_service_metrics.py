"""Every service `make run` starts serves `/metrics` and `/healthz` (issue 27, item 5):
each health answers 200 and `promtool check metrics`, Prometheus's own linter, passes
on each metrics page.

On the session's local platform (the `platform` fixture, which `make test` starts for
test_faults' local test anyway: no platform of its own). promtool is the one on PATH
or Debian's, fetched by infra/ci/promtool.sh; where it cannot be had the lint test is
skipped with a warning, and fails under CI=true.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from infra.artifacts import REPO_ROOT
from infra.platform import Platform
from infra.platform.services import http_get
from infra.testing import run_ci_script, skip_or_fail

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.stack,
    pytest.mark.spark,
    pytest.mark.local,
    pytest.mark.heavy(seconds=110),
]

#: Each platform service and the prefix of its own metric names.
SERVICES = {
    "relay": "relay_",
    "spark-pipeline": "pipeline_",
    "ingestor": "ingestor_",
    "gateway": "gateway_",
}
HEALTHY_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool's path: on PATH, or taken from Debian's prometheus package."""
    done = run_ci_script("promtool.sh", timeout_s=600)
    if done.returncode == 0:
        return done.stdout.strip().splitlines()[-1]
    skip_or_fail(
        f"PROMTOOL CHECK NOT RUN: promtool not installed and infra/ci/promtool.sh could not"
        f" fetch it: {done.stderr}"
    )


def test_every_service_serves_healthz_and_its_metrics(platform: Platform) -> None:
    urls = platform.endpoints.metrics
    assert set(urls) == set(SERVICES)
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    for name, url in urls.items():
        # Ready services: a 503 here is a health that disagrees with readiness.
        while (health := http_get(f"{url}/healthz"))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.5)  # polling the readiness condition itself
        assert health[0] == 200, f"{name} /healthz: {health}"
        status, body = http_get(f"{url}/metrics")
        assert status == 200, f"{name} /metrics: HTTP {status}"
        assert f"\n# TYPE {SERVICES[name]}" in body, f"{name} exports none of its own metrics"


def test_promtool_check_metrics_passes_on_every_service(platform: Platform, promtool: str) -> None:
    failures = {}
    for name, url in platform.endpoints.metrics.items():
        status, body = http_get(f"{url}/metrics")
        assert status == 200, f"{name} /metrics: HTTP {status}"
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
        )
        if lint.returncode != 0:
            failures[name] = (lint.stdout + lint.stderr).strip()
    assert not failures, failures


def test_the_alert_rules_pass_their_promtool_tests(promtool: str) -> None:
    """infra/compose/prometheus/alerts_test.yml: e.g. LiveEngineLagGrowing fires for a
    partition whose lag grows past 10,000, not for one catching up or a small one."""
    done = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yml"],
        cwd=REPO_ROOT / "infra" / "compose" / "prometheus",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
