"""FeedStatus on `{ticker}|status`: forwarded from ingestors, replayed, repeated, refused."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from mdproto import envelope
from mdproto.messages import DataRequest, FeedStatus
from relay.feedstatus import MAX_REFUSALS, StatusBoard, refused_period, status_ticker

if TYPE_CHECKING:
    from conftest import FakePipeline, RelayFactory
    from relay.sockets import Socket

TICKER = "BINANCE:BTC/USDT"
TICK = f"{TICKER}|tick"
STATUS = f"{TICKER}|status"


def next_status(sub: Socket, timeout: float = 5.0) -> tuple[str, FeedStatus]:
    if not sub.poll(int(timeout * 1000)):
        raise AssertionError(f"no FeedStatus within {timeout} s")
    topic, message = envelope.decode_sub(sub.recv_multipart())
    assert isinstance(message, FeedStatus)
    return topic, message


def failed(ticker: str = TICKER) -> FeedStatus:
    return FeedStatus(
        ticker=ticker,
        state=FeedStatus.FAILED,
        error_code="bad_symbol",
        reason="binance does not have market symbol",
        ingestor_id="ing-1",
        at_ms=1,
    )


def test_an_ingestors_status_reaches_the_tickers_status_subscribers(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_refresh_s=600)
    ingestor = relay.ingestor()
    sub = relay.subscriber(STATUS, TICK)
    other = relay.subscriber("BINANCE:ETH/USDT|status")
    pipeline.wait_subscribed(STATUS, TICK, "BINANCE:ETH/USDT|status")
    ingestor.next_work(DataRequest.REALTIME)
    started = FeedStatus(ticker=TICKER, state=FeedStatus.STARTED, ingestor_id="ing-1")
    ingestor.respond(started)
    topic, status = next_status(sub)
    assert (topic, status) == (STATUS, started)
    ingestor.respond(failed())
    assert next_status(sub)[1] == failed()
    assert not other.poll(300)  # another ticker's status topic: filtered by the XPUB
    assert relay.sample("relay_feed_status_total", state="FAILED", source="ingestor") == 1


def test_a_late_subscriber_learns_a_failed_feed_at_once(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_refresh_s=600, status_repeat_s=600)
    ingestor = relay.ingestor()
    relay.subscriber(TICK)
    ingestor.next_work(DataRequest.REALTIME)
    ingestor.respond(failed())
    relay.wait_until(
        lambda: relay.sample("relay_feed_status_total", state="FAILED", source="ingestor") == 1
    )
    late = relay.subscriber(STATUS)
    # Replayed on the subscription edge: the next repeat is 600 s away.
    assert next_status(late)[1] == failed()


def test_a_second_subscriber_learns_it_from_the_repeat(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    """No subscription edge reaches the relay for the second client: the repeat tells it."""
    relay = make_relay(realtime_refresh_s=600, status_repeat_s=0.2)
    ingestor = relay.ingestor()
    first = relay.subscriber(STATUS, TICK)
    pipeline.wait_subscribed(STATUS, TICK)
    ingestor.next_work(DataRequest.REALTIME)
    ingestor.respond(failed())
    assert next_status(first)[1] == failed()
    second = relay.subscriber(STATUS)
    assert next_status(second)[1] == failed()


def test_statuses_of_tickers_that_are_not_live_are_forwarded_not_kept(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_refresh_s=600, status_repeat_s=0.1)
    ingestor = relay.ingestor()
    sub = relay.subscriber(STATUS)  # a status topic alone starts no feed
    pipeline.wait_subscribed(STATUS)
    ingestor.respond(failed())
    assert next_status(sub)[1] == failed()
    assert not sub.poll(500)  # not live: never repeated
    assert relay.sample("relay_live_tickers") == 0


def test_an_unsupported_period_is_refused_and_starts_nothing(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_refresh_s=600, live_periods=[60, 300])
    ingestor = relay.ingestor()
    sub = relay.subscriber(STATUS, f"{TICKER}|ohlc:900")
    topic, refused = next_status(sub)
    assert topic == STATUS
    assert (refused.ticker, refused.state, refused.error_code, refused.period_seconds) == (
        TICKER,
        FeedStatus.REFUSED,
        "unsupported_period",
        900,
    )
    assert "60, 300" in refused.reason and not refused.ingestor_id
    assert not ingestor.work.poll(300)  # no REALTIME for an unsupported period
    assert relay.sample("relay_live_tickers") == 0
    relay.subscriber(f"{TICKER}|ohlc:60")  # a served period starts the feed
    _, start = ingestor.next_work(DataRequest.REALTIME)
    assert start.ticker == TICKER


def test_ticks_still_start_the_feed_next_to_a_refused_period(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    relay = make_relay(realtime_refresh_s=600, status_repeat_s=0.2)
    ingestor = relay.ingestor()
    sub = relay.subscriber(STATUS, f"{TICKER}|ohlc:600", TICK)  # 600: a prefix of nothing served
    assert next_status(sub)[1].period_seconds == 600
    _, start = ingestor.next_work(DataRequest.REALTIME)
    assert start.ticker == TICKER
    assert next_status(sub)[1].state == FeedStatus.REFUSED  # repeated while held
    sub.unsubscribe(f"{TICKER}|ohlc:600".encode())
    pipeline.wait_subscribed(STATUS, TICK)
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 2)
    while sub.poll(0):  # repeats already on their way
        sub.recv_multipart()
    assert not sub.poll(500)


class SilentSub:
    """A ZMTP 3.0 SUB over a plain TCP socket that never answers PINGs, as a client
    library without heartbeat support does (issue 47: a Go client saw the same STARTED
    about every 6 s: the relay's 1 s ping + 5 s timeout, then its reconnect)."""

    def __init__(self, endpoint: str, *topics: str) -> None:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5.0)
        self.buffer = b""
        mechanism = b"NULL".ljust(20, b"\0")
        self.sock.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism + b"\0" * 32)
        ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
        self.sock.sendall(bytes([0x04, len(ready)]) + ready)
        self._read(64)  # the relay's greeting
        for topic in topics:  # ZMTP 3.0: a subscription is a message starting 0x01
            body = b"\x01" + topic.encode()
            self.sock.sendall(bytes([0x00, len(body)]) + body)

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed by the relay")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def next_message(self, timeout: float) -> list[bytes]:
        """The next multipart message (commands such as PING are read and ignored)."""
        self.sock.settimeout(timeout)
        frames: list[bytes] = []
        while True:
            flags = self._read(1)[0]
            size = struct.unpack(">Q", self._read(8))[0] if flags & 0x02 else self._read(1)[0]
            body = self._read(size)
            if flags & 0x04:  # a command: READY, PING
                continue
            frames.append(body)
            if not flags & 0x01:
                return frames

    def statuses(self, timeout: float) -> Iterator[FeedStatus]:
        """FeedStatus messages until the relay closes the connection (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                frames = self.next_message(left)
            except (ConnectionResetError, TimeoutError):
                return
            _, message = envelope.decode_sub(frames)
            if isinstance(message, FeedStatus):
                yield message

    def close(self) -> None:
        self.sock.close()


def test_started_is_replayed_to_a_resubscribing_client_never_repeated_to_everyone(
    make_relay: RelayFactory, pipeline: FakePipeline
) -> None:
    """docs/protocol.md "Live feed status": the relay repeats LOST/FAILED/REFUSED every
    `status_repeat_s`, never STARTED; a topic's first subscription gets the held status,
    so a client whose connection the relay dropped (no PONG within the heartbeat
    timeout) gets the same STARTED, same `at_ms`, again when it reconnects."""
    relay = make_relay(
        realtime_refresh_s=600, status_repeat_s=0.1, heartbeat_ivl_ms=100, heartbeat_timeout_ms=400
    )
    ingestor = relay.ingestor()
    steady = relay.subscriber(STATUS, TICK)  # libzmq: answers PINGs, stays connected
    pipeline.wait_subscribed(STATUS, TICK)
    ingestor.next_work(DataRequest.REALTIME)
    started = FeedStatus(ticker=TICKER, state=FeedStatus.STARTED, ingestor_id="i", at_ms=42)
    ingestor.respond(started)
    assert next_status(steady)[1] == started
    assert not steady.poll(1000)  # ten repeat periods: STARTED is not repeated
    steady.unsubscribe(STATUS.encode())  # the ticks keep the feed live
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 1)  # TICK alone
    silent = SilentSub(relay.endpoints.market_data, STATUS)
    try:
        dropped_after = time.monotonic()
        seen = list(silent.statuses(timeout=5.0))  # until the relay drops it
        dropped_after = time.monotonic() - dropped_after
    finally:
        silent.close()
    assert 0.3 < dropped_after < 4.0, "dropped by the ZMTP heartbeat timeout, not our timeout"
    assert seen == [started]  # replayed on its subscription, the topic's first
    # The relay has seen the dropped connection's topic go (the XPUB passes only a
    # topic's first subscription up: the next one must find it gone).
    relay.wait_until(lambda: relay.sample("relay_subscribed_topics") == 1)
    again = SilentSub(relay.endpoints.market_data, STATUS)  # the client reconnects
    try:
        assert next(again.statuses(timeout=10.0)) == started  # the same at_ms: a replay
    finally:
        again.close()


def test_wrong_message_types_from_an_ingestor_are_counted(make_relay: RelayFactory) -> None:
    relay = make_relay()
    ingestor = relay.ingestor()
    ingestor.respond(DataRequest(request_id="x"))
    relay.wait_until(
        lambda: (
            relay.sample("relay_bad_frames_total", socket="ingestor", error_code="unexpected_type")
            == 1
        )
    )


# --- the pure parts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "period"),
    [
        (f"{TICKER}|ohlc:900", 900),
        (f"{TICKER}|ohlc:6", 6),  # a prefix of ohlc:60 on the wire, but not a served period
        (f"{TICKER}|ohlc:60", None),
        (f"{TICKER}|ohlc:", None),
        (TICK, None),
        (STATUS, None),
        ("RESPONSE:c1", None),
    ],
)
def test_refused_period(topic: str, period: int | None) -> None:
    assert refused_period(topic, (60, 300, 3600)) == period


def test_status_ticker() -> None:
    assert status_ticker(STATUS) == TICKER
    assert status_ticker(f"{TICKER}|statusx") is None
    assert status_ticker(TICK) is None


def test_board_keeps_one_status_per_live_ticker_and_repeats_the_bad_ones() -> None:
    board = StatusBoard(live_periods=[60], repeat_s=1.0, now=0.0)
    board.record(FeedStatus(ticker=TICKER, state=FeedStatus.STARTED), live=True)
    assert board.next_deadline() is None  # nothing to repeat
    board.record(failed(), live=True)
    board.record(failed("BINANCE:ETH/USDT"), live=False)
    refusal = board.refuse(f"{TICKER}|ohlc:900", at_ms=5)
    assert refusal is not None and board.refuse(f"{TICKER}|ohlc:60", at_ms=5) is None
    assert board.latest(TICKER) == [failed(), refusal]
    assert board.latest("BINANCE:ETH/USDT") == []
    assert board.due(0.5) == [] and board.next_deadline() == 1.0
    assert board.due(1.0) == [failed(), refusal]
    board.unsubscribed(f"{TICKER}|ohlc:900")
    board.forget(TICKER)
    assert len(board) == 0 and board.due(5.0) == []


def test_board_keeps_a_bounded_number_of_refusals() -> None:
    board = StatusBoard(live_periods=[60], repeat_s=1.0, now=0.0)
    for period in range(1000, 1000 + MAX_REFUSALS + 10):
        assert board.refuse(f"{TICKER}|ohlc:{period}", at_ms=1) is not None  # always told once
    assert len(board) == MAX_REFUSALS and len(board.due(1.0)) == MAX_REFUSALS
