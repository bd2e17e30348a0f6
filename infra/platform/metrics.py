"""Reading a service's Prometheus page, and the samples that say the platform is ready.

Production code (the local platform's readiness probes, the compose platform's
waits) and tests share these; nothing here is a test helper.
"""

from __future__ import annotations

import re
import urllib.request

from relay.metrics import INGESTOR_SUBSCRIPTIONS, PIPELINE_SERVING

#: The readiness signal: 1 on a relay once the pipeline's heartbeat reached it and
#: says it serves history, so a history submit is accepted (not `pipeline_unavailable`).
PIPELINE_SERVES_HISTORY = f'{PIPELINE_SERVING}{{work="history"}}'
#: At least 1 on a relay once an ingestor subscribed to its work socket.
INGESTOR_SUBSCRIBED = f'{INGESTOR_SUBSCRIPTIONS}{{socket="work"}}'


def metric_sample(metrics_url: str, sample: str) -> float | None:
    """One sample (``name{labels}``) from a Prometheus text page such as a relay's
    /metrics; None when the service does not answer or does not export it."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(metrics_url, timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return None
    match = re.search(rf"^{re.escape(sample)} (\S+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else None
