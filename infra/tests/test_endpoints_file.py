"""endpoints.json: every client-facing address of a platform, for clients in any language
(issue 47: the file listed the stack alone; a client took 5558/5559/8090 from prose)."""

from __future__ import annotations

import json
from pathlib import Path

from infra.compose_platform import default_ports, endpoints_for
from infra.localstack import LocalStack, StackConfig
from infra.localstack.endpoints import CLIENTS_KEY, ENDPOINTS_FILE, StackEndpoints
from infra.platform.config import PlatformConfig, ServicePorts
from infra.platform.supervisor import Platform

REPO = Path(__file__).resolve().parents[2]
CLIENT_KEYS = {"request", "market_data", "gateway", "gateway_ws", "catalog", "s3", "metrics"}


def _platform(tmp_path: Path) -> Platform:
    ports = ServicePorts(client_request=15559, market_data=15558, gateway=18090)
    return Platform(
        PlatformConfig(data_dir=tmp_path, ports=ports),
        stack_config=StackConfig(data_dir=tmp_path),
        use_simulator=True,
        log=lambda line: None,
    )


def test_make_runs_file_lists_every_client_facing_address(tmp_path: Path) -> None:
    platform = _platform(tmp_path)
    clients = platform.endpoints.clients()
    assert set(clients) == CLIENT_KEYS
    assert clients["request"] == ["tcp://127.0.0.1:15559"]
    assert clients["market_data"] == ["tcp://127.0.0.1:15558"]
    assert clients["gateway"] == "http://127.0.0.1:18090"
    assert clients["gateway_ws"] == "ws://127.0.0.1:18090/ws"
    assert clients["catalog"] == platform.stack.endpoints.catalog_uri
    assert clients["s3"] == platform.stack.endpoints.s3_endpoint
    metrics = clients["metrics"]
    assert isinstance(metrics, dict)
    assert {"relay", "ingestor", "spark-pipeline", "gateway"} <= set(metrics)


def test_every_phase_writes_the_clients_section_and_the_stack_still_loads(tmp_path: Path) -> None:
    """A phase restarted alone (a crashed component) rewrites the file: with the clients."""
    config = StackConfig(data_dir=tmp_path)
    clients = {"request": ["tcp://127.0.0.1:5559"], "gateway": None}
    stack = LocalStack(
        config, components=lambda c, e: [], log=lambda line: None, clients=lambda: clients
    )
    stack.up()  # nothing to start: writes the file
    document = json.loads((tmp_path / ENDPOINTS_FILE).read_text())
    assert document[CLIENTS_KEY] == clients
    assert StackEndpoints.load(tmp_path) == stack.endpoints  # readers of the stack's fields
    bare = LocalStack(config, components=lambda c, e: [], log=lambda line: None)
    bare.up()  # `make up-local`: the stack alone, no platform, no clients section
    assert CLIENTS_KEY not in json.loads((tmp_path / ENDPOINTS_FILE).read_text())


def test_composes_file_is_the_same_layout_at_the_published_default_ports() -> None:
    """infra/compose/endpoints.json (docs/docker.md "Where clients find it"): both relays,
    the gateway and the relays' metrics at docker-compose.yml's default host ports."""
    ports = default_ports((REPO / "docker-compose.yml").read_text())
    expected = endpoints_for("mdp", ports, offline=False).endpoints_json()
    path = REPO / "infra" / "compose" / "endpoints.json"
    assert path.read_text() == expected, f"{path} is stale; write it again:\n{expected}"
    clients = json.loads(expected)[CLIENTS_KEY]
    assert set(clients) == CLIENT_KEYS
    assert clients["request"] == ["tcp://127.0.0.1:5559", "tcp://127.0.0.1:15559"]
    assert clients["gateway_ws"] == "ws://127.0.0.1:8090/ws"
    # The host's S3 (MinIO published on the local stack's port), not the catalog's minio:9000.
    assert clients["s3"] == "http://127.0.0.1:8333"
    assert set(clients["metrics"]) == {"relay", "relay-2"}


def test_the_docs_name_every_key_of_the_clients_section() -> None:
    for doc in ("docs/protocol.md", "docs/docker.md"):
        text = (REPO / doc).read_text()
        assert "endpoints.json" in text, doc
    protocol = (REPO / "docs" / "protocol.md").read_text()
    missing = [key for key in CLIENT_KEYS if f"`{key}`" not in protocol]
    assert not missing, f"docs/protocol.md does not describe {missing}"
