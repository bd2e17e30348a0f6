"""Reachability checks run before Spark starts (Spark's own errors come late and long).

Each failure names the endpoint and the config key that set it.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from mdproto import contracts
from mdproto.runtime.kafka import ensure_topics, quiet_logger, spec
from pipeline.config import Settings

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """A dependency of the pipeline is unreachable or misconfigured."""


def _admin(bootstrap: str, timeout_s: float) -> Any:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": int(timeout_s * 1000),
        "logger": quiet_logger("preflight"),
    }
    return AdminClient(conf)


def check_kafka(bootstrap: str, timeout_s: float, wanted_topics: list[str]) -> list[str]:
    """Raise StartupError if no broker answers; return the wanted topics that do not exist."""
    from confluent_kafka import KafkaException

    admin = _admin(bootstrap, timeout_s)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise StartupError(
            f"Kafka is unreachable at {bootstrap} (kafka.bootstrap_servers): {exc.args[0]}"
        ) from None
    if not metadata.brokers:
        raise StartupError(f"Kafka at {bootstrap} (kafka.bootstrap_servers) reports no brokers")
    return [t for t in wanted_topics if t not in metadata.topics]


def _http_get(url: str, timeout_s: float) -> int:
    request = urllib.request.Request(url, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:  # an answer, just not a 2xx one
        return int(exc.code)


def check_catalog(uri: str, warehouse: str, timeout_s: float) -> None:
    """GET {uri}/v1/config: what every Iceberg REST client asks first."""
    url = f"{uri.rstrip('/')}/v1/config?{urllib.parse.urlencode({'warehouse': warehouse})}"
    try:
        status = _http_get(url, timeout_s)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StartupError(
            f"Iceberg REST catalog is unreachable at {uri} (catalog.uri): {reason}"
        ) from None
    if status != 200:
        raise StartupError(
            f"Iceberg REST catalog at {uri} (catalog.uri) answered HTTP {status} to GET {url}"
        )


def check_s3(endpoint: str, timeout_s: float) -> None:
    """Any HTTP answer will do (an anonymous GET is usually 403): we only test reachability."""
    try:
        _http_get(endpoint, timeout_s)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StartupError(
            f"S3 store is unreachable at {endpoint} (catalog.s3_endpoint): {reason}"
        ) from None


def check_all(settings: Settings) -> None:
    k = settings.kafka
    wanted = []
    if settings.history.enabled:
        wanted.append(spec(contracts.KAFKA_OHLC_BATCHES, k.topic_ohlc_batches))
    if settings.live.enabled or settings.cep.enabled:  # CEP reads ticks too
        wanted.append(spec(contracts.KAFKA_TICKS, k.topic_ticks))
    if settings.live.enabled:
        wanted.append(spec(contracts.KAFKA_LIVE_CANDLES, k.topic_live_candles))
        wanted.append(spec(contracts.KAFKA_LIVE_CORRECTIONS, k.topic_live_corrections))
        wanted.append(spec(contracts.KAFKA_BOOK, k.topic_book))
    if settings.markets.enabled:
        wanted.append(spec(contracts.KAFKA_MARKETS, k.topic_markets))
    if settings.gaps.enabled:  # the ingestors create it too: whoever starts first, compacted
        wanted.append(spec(contracts.KAFKA_RECORDING, k.topic_recording))
    missing = check_kafka(k.bootstrap_servers, k.connect_timeout_s, [t.name for t in wanted])
    if missing and k.ensure_topics:
        try:
            ensure_topics(
                k.bootstrap_servers,
                [t for t in wanted if t.name in missing],
                partitions=k.topic_partitions,
                replication=k.replication_factor,
                timeout_s=k.connect_timeout_s,
            )
        except Exception as exc:
            raise StartupError(f"cannot create Kafka topics {missing}: {exc}") from None
    elif missing:
        raise StartupError(
            f"Kafka topics {missing} do not exist at {k.bootstrap_servers} "
            "and kafka.ensure_topics is off"
        )
    c = settings.catalog
    check_catalog(c.uri, c.warehouse, c.connect_timeout_s)
    check_s3(c.s3_endpoint, c.connect_timeout_s)
    log.info(
        "preflight ok: Kafka %s, catalog %s, S3 %s",
        settings.kafka.bootstrap_servers,
        c.uri,
        c.s3_endpoint,
    )
