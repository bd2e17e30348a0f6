"""The ZeroMQ relay: the platform's one well-known bind point (see README.md)."""

from relay.app import Relay
from relay.config import RelaySettings, load_settings
from relay.triggers import NoTriggerStore, TriggerSink, TriggerSinkError

__all__ = [
    "NoTriggerStore",
    "Relay",
    "RelaySettings",
    "TriggerSink",
    "TriggerSinkError",
    "load_settings",
]
