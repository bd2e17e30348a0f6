"""The whole platform as local processes: the stack plus every service (`make run`)."""

from infra.platform.config import PlatformConfig, ServicePorts
from infra.platform.supervisor import Platform

__all__ = ["Platform", "PlatformConfig", "ServicePorts"]
