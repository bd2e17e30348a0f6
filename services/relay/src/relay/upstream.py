"""Where the market-data XSUB reads from: the pipeline, parent relays, or both.

A relay's XSUB may connect to several upstreams (`RelaySettings.upstreams`):
the pipeline's PUB (:5557) and/or other relays' market-data XPUBs (:5558). A
relay whose upstream is another relay is a branch of a relay tree: its clients'
subscriptions travel up (the XSUB sends each subscription to every upstream it
is connected to and resends them all after a reconnect; a relay's client XPUB
passes the first subscribe and last unsubscribe of a topic on to its own
XSUB), data travels down. docs/protocol.md "Failover and chaining".

`UpstreamLinks` is the bookkeeping of which upstreams hold a live connection,
fed by the XSUB's socket-monitor events (pure: no sockets here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import zmq

_CONNECTED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)


@dataclass(frozen=True, slots=True)
class LinkChange:
    """An upstream connection came up or went down (what the relay logs and counts)."""

    endpoint: str
    up: bool
    connected: int  # upstreams connected after this change
    total: int


class UpstreamLinks:
    """The set of upstream endpoints with a handshaken connection."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = tuple(endpoints)
        self._up: set[str] = set()

    @property
    def connected(self) -> int:
        return len(self._up)

    def is_upstream(self, address: str) -> bool:
        """Whether a monitor event's `address` is one of the endpoints connected to (a
        peer that connected to one of the socket's bound ports reports another)."""
        return address in self.endpoints

    def on_event(self, event: int | None, address: str) -> LinkChange | None:
        """A monitor event for `address` (the endpoint as connected); None if nothing changed
        or `address` is no upstream."""
        if not self.is_upstream(address):
            return None
        if event == _CONNECTED and address not in self._up:
            self._up.add(address)
        elif event == _DISCONNECTED and address in self._up:
            self._up.discard(address)
        else:
            return None
        return LinkChange(address, event == _CONNECTED, len(self._up), len(self.endpoints))

    def describe(self) -> str:
        return ", ".join(self.endpoints)
