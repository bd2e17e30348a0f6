"""Relay trees: a relay whose upstream is another relay's market-data XPUB (real sockets).

    FakePipeline (XPUB) -> root relay -> middle relay -> leaf relay -> client SUB

The branches have no pipeline connection of their own (flink_market_data_endpoint
""), only `upstream_market_data`, so whatever the client sees came down the chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mdproto import envelope
from mdproto.messages import Tick

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory, RunningRelay

TICK = "BINANCE:BTC/USDT|tick"
OTHER = "BINANCE:ETH/USDT|tick"


def _chain(make_relay: RelayFactory, levels: int, **overrides: object) -> list[RunningRelay]:
    relays = [make_relay(**overrides)]
    for _ in range(levels - 1):
        parent = relays[-1].endpoints.market_data
        relays.append(
            make_relay(flink_market_data_endpoint="", upstream_market_data=[parent], **overrides)
        )
    return relays


def test_three_level_chain_delivers_every_message_in_order(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    # Unbounded HWMs: this checks the chain's forwarding, not drop policy under overload.
    root, middle, leaf = _chain(make_relay, 3, high_water_mark=0)
    sub = leaf.subscriber(TICK)
    pipeline.wait_subscribed(TICK)  # the leaf client's subscription travelled up 3 relays
    assert OTHER not in pipeline.subscriptions
    for r in (middle, leaf):
        r.wait_until(lambda r=r: r.sample("relay_upstream_connected") == 1)
    # The middle relay sees its child's subscription as a client subscription: a tree
    # starts live feeds at the root, where the ingestors are.
    middle.wait_until(lambda: middle.sample("relay_subscribed_topics") == 1)
    root.wait_until(lambda: root.sample("relay_subscribed_topics") == 1)

    count = 20_000
    for seq in range(1, count + 1):
        tick = Tick(ticker="BINANCE:BTC/USDT", trade_id=str(seq), sequence=seq, publisher_epoch=7)
        pipeline.publish(TICK, tick)
        if seq % 500 == 0:  # another topic in between: filtered out on the way
            pipeline.publish(OTHER, Tick(ticker="BINANCE:ETH/USDT", sequence=seq))
    seen = []
    for _ in range(count):
        topic, message = envelope.decode_sub(leaf.recv(sub))
        assert topic == TICK and isinstance(message, Tick)
        seen.append(message.sequence)
    assert seen == list(range(1, count + 1))
    assert not sub.poll(100)  # nothing else arrived

    # The last unsubscribe travels up too: the pipeline stops sending the topic.
    sub.unsubscribe(TICK.encode())

    def unsubscribed() -> bool:
        pipeline.poll_subscriptions(0.05)
        return TICK not in pipeline.subscriptions

    leaf.wait_until(unsubscribed, what="the unsubscribe to reach the pipeline")


def test_branch_resubscribes_when_its_parent_restarts(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    """A parent relay that comes back gets its children's subscriptions again."""
    root, leaf = _chain(make_relay, 2)
    sub = leaf.subscriber(TICK)
    pipeline.wait_subscribed(TICK)
    port = root.endpoints.market_data.rsplit(":", 1)[1]
    root.stop()
    leaf.wait_until(lambda: leaf.sample("relay_upstream_connected") == 0)
    pipeline.poll_subscriptions(0.2, quiet=0.2)  # the old root's unsubscribe, if any
    pipeline.subscriptions.clear()
    again = make_relay(market_data_pub_port=int(port))
    again.wait_until(lambda: again.sample("relay_upstream_connected") == 1)
    pipeline.wait_subscribed(TICK, timeout=10)  # resent by the leaf's XSUB, forwarded up
    tick = Tick(ticker="BINANCE:BTC/USDT", trade_id="after", sequence=1, publisher_epoch=8)
    pipeline.publish(TICK, tick)
    assert envelope.decode_sub(leaf.recv(sub, 10)) == (TICK, tick)
    assert leaf.sample("relay_upstream_disconnects_total") >= 1


def test_upstream_links_count_each_endpoint_once() -> None:
    """Monitor events per endpoint: repeats and events of unknown links change nothing."""
    import zmq

    from relay.upstream import UpstreamLinks

    links = UpstreamLinks(["tcp://p:5557", "tcp://r:5558"])
    up, down = int(zmq.EVENT_HANDSHAKE_SUCCEEDED), int(zmq.EVENT_DISCONNECTED)
    assert links.on_event(down, "tcp://p:5557") is None  # never connected
    first = links.on_event(up, "tcp://p:5557")
    assert first is not None and (first.up, first.connected, first.total) == (True, 1, 2)
    assert links.on_event(up, "tcp://p:5557") is None  # a repeat
    assert links.on_event(up, "tcp://r:5558") is not None and links.connected == 2
    lost = links.on_event(down, "tcp://r:5558")
    assert lost is not None and (lost.endpoint, lost.up, lost.connected) == (
        "tcp://r:5558",
        False,
        1,
    )
    assert links.on_event(None, "tcp://p:5557") is None  # a malformed monitor message
    # A peer on a bound port (a live engine: tcp://<own address>:5561) is no upstream.
    assert links.on_event(up, "tcp://172.18.0.10:5561") is None and links.connected == 1
    assert links.describe() == "tcp://p:5557, tcp://r:5558"


def test_branch_reaches_a_curve_parent_with_its_own_keys(
    make_relay: RelayFactory, pipeline: FakePipeline, tmp_path: Path
) -> None:
    """A tree across sites: the parent's :5558 requires CURVE, the branch holds allowed keys."""
    from relay import curve

    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    for name in ("root", "branch", "stranger"):
        curve.generate(keys, name)
    allowed.mkdir()
    (allowed / "branch.key").write_bytes((keys / "branch.key").read_bytes())
    root = make_relay(
        curve_secret_key_file=str(keys / "root.key_secret"), curve_client_keys_dir=str(allowed)
    )

    def branch(name: str) -> RunningRelay:
        return make_relay(
            flink_market_data_endpoint="",
            upstream_market_data=[root.endpoints.market_data],
            upstream_curve_secret_key_file=str(keys / f"{name}.key_secret"),
            upstream_curve_server_key_file=str(keys / "root.key"),
        )

    leaf = branch("branch")
    sub = leaf.subscriber(TICK)
    pipeline.wait_subscribed(TICK)
    tick = Tick(ticker="BINANCE:BTC/USDT", trade_id="1", sequence=1, publisher_epoch=1)
    pipeline.publish(TICK, tick)
    assert envelope.decode_sub(leaf.recv(sub)) == (TICK, tick)
    outsider = branch("stranger")  # keys the root does not allow: refused and counted
    root.wait_until(
        lambda: root.sample("relay_auth_failures_total", socket="market_data") >= 1,
        what="the stranger's handshake to be refused",
    )
    assert outsider.sample("relay_upstream_connected") == 0
