"""Reachability checks run before Spark starts (Spark's own errors come late and long).

Each failure names the endpoint and the config key that set it.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pipeline.config import Settings

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """A dependency of the pipeline is unreachable or misconfigured."""


def _admin(bootstrap: str, timeout_s: float) -> Any:
    from confluent_kafka.admin import AdminClient

    quiet = logging.getLogger("pipeline.preflight.librdkafka")
    quiet.setLevel(logging.CRITICAL)
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.timeout.ms": int(timeout_s * 1000),
        "logger": quiet,
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


def create_topics(
    bootstrap: str, timeout_s: float, names: list[str], partitions: int, replication: int
) -> None:
    """Create topics (a topic another process created meanwhile is fine)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.cimpl import NewTopic

    admin = _admin(bootstrap, timeout_s)
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=replication) for n in names],
        operation_timeout=timeout_s,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            log.info("created Kafka topic %s (%d partitions)", name, partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise StartupError(
                    f"cannot create Kafka topic {name} at {bootstrap}: {exc}"
                ) from None


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
    wanted = []
    if settings.history.enabled:
        wanted.append(settings.kafka.topic_ohlc_batches)
    if settings.live.enabled or settings.cep.enabled:  # the CEP query reads ticks too
        wanted.append(settings.kafka.topic_ticks)
    k = settings.kafka
    missing = check_kafka(k.bootstrap_servers, k.connect_timeout_s, wanted)
    if missing and k.ensure_topics:
        create_topics(
            k.bootstrap_servers,
            k.connect_timeout_s,
            missing,
            k.topic_partitions,
            k.replication_factor,
        )
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
