"""Data survives ``down`` then ``up``; ``down`` works from another LocalStack (pid files).

Runs its own stack (not the session one) so restarting it cannot disturb
other tests.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from pyiceberg.catalog import load_catalog

from infra.localstack import LocalStack, start_on_free_ports
from infra.localstack.process import port_is_free
from infra.testing import consume

pytestmark = pytest.mark.stack


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[LocalStack]:
    stack = start_on_free_ports(tmp_path / "data")
    try:
        yield stack
    finally:
        stack.down()


def _assert_fully_stopped(stack: LocalStack) -> None:
    assert [s.state for s in stack.status()] == ["stopped"] * len(stack.components)
    for comp in stack.components:
        for port in comp.ports.values():
            assert port_is_free(port, "127.0.0.1"), f"{comp.name} still holds port {port}"
            # weed's per-port gRPC unix sockets must not litter /tmp
            assert not list(Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"))
    assert not list((stack.config.data_dir / "run").glob("*.sock"))


def test_kafka_and_iceberg_data_survive_restart(own_stack: LocalStack) -> None:
    e = own_stack.endpoints
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": e.kafka_bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce(topic, value=f"r{i}".encode())
    assert producer.flush(30) == 0

    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    catalog.create_namespace("durable")
    table = catalog.create_table("durable.t", schema=pa.schema([pa.field("n", pa.int64())]))
    table.append(pa.table({"n": pa.array(range(7), pa.int64())}))

    running = own_stack.status()
    assert all(s.state == "running" and s.rss_bytes > 0 for s in running)
    pids = {s.name: s.pid for s in running}

    own_stack.down()
    _assert_fully_stopped(own_stack)

    own_stack.up()
    assert {s.name: s.pid for s in own_stack.status()}.keys() == pids.keys()
    assert all(s.pid != pids[s.name] for s in own_stack.status())

    consumer = Consumer(
        {
            "bootstrap.servers": e.kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:
        values = sorted(m.value() or b"" for m in consume(consumer, 10))
    finally:
        consumer.close()
    assert values == sorted(f"r{i}".encode() for i in range(10))

    catalog = load_catalog(e.catalog_name, **e.pyiceberg_catalog_properties())
    rows = catalog.load_table("durable.t").scan().to_arrow()
    assert sorted(rows.column("n").to_pylist()) == list(range(7))

    # `down` needs only the data dir's pid files, as for `python -m infra.localstack down`.
    LocalStack(own_stack.config, log=lambda _: None).down()
    _assert_fully_stopped(own_stack)
