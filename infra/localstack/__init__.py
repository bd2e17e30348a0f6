"""The local platform stack: Kafka, SeaweedFS S3 and the Iceberg REST catalog.

    from infra.localstack import LocalStack, StackConfig, Ports

    stack = LocalStack(StackConfig(data_dir=tmp, ports=Ports.free()))
    endpoints = stack.up()
    ...
    stack.down()

See infra/README.md for the endpoints and client helpers.
"""

from infra.localstack.config import KafkaSettings, Ports, StackConfig
from infra.localstack.endpoints import StackEndpoints
from infra.localstack.process import ComponentStartError, PortInUseError, StackError
from infra.localstack.stack import ComponentStatus, LocalStack, endpoints_for, start_on_free_ports

__all__ = [
    "ComponentStartError",
    "ComponentStatus",
    "KafkaSettings",
    "LocalStack",
    "PortInUseError",
    "Ports",
    "StackConfig",
    "StackEndpoints",
    "StackError",
    "endpoints_for",
    "start_on_free_ports",
]
