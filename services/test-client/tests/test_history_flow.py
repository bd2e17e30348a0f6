"""History flow against a fake relay: ordering, both patterns, errors, retries."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mdclient import (
    Client,
    HistoryFailed,
    HistoryTimeout,
    InvalidRequest,
    ProtocolMismatch,
    RelayUnavailable,
    RequestTimeout,
    SubmitRejected,
)
from mdclient.config import ClientSettings
from mdproto import topics
from mdproto.messages import (
    NotifyPattern,
    RequestStatusQuery,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)

TICKER = "BINANCE:BTC/USDT"
START = 1_795_132_800_000  # 2026-11-20T00:00Z
END = START + 3_600_000


def _submits(relay: Any) -> list[SubmitHistoricalRequest]:
    return [m for m in relay.requests if isinstance(m, SubmitHistoricalRequest)]


def test_per_client_subscribes_once_at_connect_before_any_submit(
    fake_relay: Any, settings_for: Any, fake_reader: Any
) -> None:
    with Client(settings=settings_for(fake_relay, client_id="alice"), reader=fake_reader) as c:
        topic = topics.response_topic("alice")
        fake_relay.wait_for(lambda ev: ("sub", topic) in ev)  # at connect, before any request
        assert fake_relay.requests == []
        first = c.history(TICKER, "1m", START, END)
        second = c.history(TICKER, 60, START, END)
        sub_at = fake_relay.index_of("sub", lambda t: t == topic)
        req_at = fake_relay.index_of("req", lambda m: True)
        assert sub_at < req_at
        watched = {topics.PIPELINE_STATUS, topics.ingestors_status_topic("BINANCE")}
        notifications = [t for t in fake_relay.subscriptions() if t not in watched]
        assert notifications == [topic]  # reused, not re-subscribed
        submits = _submits(fake_relay)
    assert [s.notify for s in submits] == [NotifyPattern.NOTIFY_PER_CLIENT] * 2
    assert all(s.client_id == "alice" for s in submits)
    assert first.request_id == submits[0].request_id != second.request_id
    assert first.status == "OK" and first.snapshot_id == 42 and first.reported_rows == 3
    assert len(first) == 1
    # Read pinned to the notification's snapshot, filtered to the request.
    assert fake_reader.calls[0] == {
        "table": "market.ohlc",
        "ticker": TICKER,
        "period": 60,
        "start": START,
        "end": END,
        "snapshot_id": 42,
    }


def test_an_expired_pinned_snapshot_is_read_current_and_said_so(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    fake_relay.handler = kit.accept_and_notify()
    fake_reader.expired.add(42)  # the notification's snapshot
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
    assert [call["snapshot_id"] for call in fake_reader.calls] == [42, None]
    assert len(result) == 1 and result.snapshot_id == 42
    assert result.snapshot_note.startswith("snapshot 42 is gone: read the current snapshot")


def test_refetch_is_asked_for_only_when_wanted(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    fake_relay.handler = kit.accept_and_notify()
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        c.history(TICKER, "1m", START, END)
        c.history(TICKER, "1m", START, END, refetch=True)
    assert [s.refetch for s in _submits(fake_relay)] == [False, True]


def test_tick_and_volume_bars_are_asked_for_by_period_and_read_from_their_table(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    """`100TICKS` / `2.50vol` in the period place: period_seconds 0 and the canonical bars
    on the wire, the rows read from the table the notification names."""
    fake_relay.handler = kit.accept_and_notify()
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        ticks = c.history(TICKER, "100TICKS", START, END)
        c.history(TICKER, "2.50vol", START, END)
        with pytest.raises(InvalidRequest) as bad:
            c.history(TICKER, "0ticks", START, END)
    assert bad.value.error_code == "bad_bars"
    assert [(s.bars, s.period_seconds) for s in _submits(fake_relay)] == [
        ("100ticks", 0),
        ("2.5vol", 0),
    ]  # the bad one never left the client
    assert fake_reader.calls[0] == {
        "table": "market.trade_bars",
        "ticker": TICKER,
        "bars": "100ticks",
        "start": START,
        "end": END,
        "snapshot_id": 42,
    }
    assert len(ticks) == 2 and ticks.notification is not None
    assert ticks.notification.bars == "100ticks"


def test_no_tick_bars_is_an_empty_table_of_their_columns(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    fake_relay.handler = kit.accept_and_notify(status=Status.NOT_FOUND, row_count=0)
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        result = c.history(TICKER, "100ticks", START, END)
    assert result.empty and "seq" in result.table.column_names
    assert fake_reader.calls == []  # nothing to read


def test_per_request_subscribes_before_each_submit_and_unsubscribes_after(
    fake_relay: Any, settings_for: Any, fake_reader: Any
) -> None:
    settings = settings_for(fake_relay, notify="per_request")
    with Client(settings=settings, reader=fake_reader) as c:
        assert fake_relay.subscriptions() == []  # nothing at connect in this pattern
        result = c.history(TICKER, "1m", START, END)
        (submit,) = _submits(fake_relay)
        topic = topics.history_ready_topic(submit.request_id)
        assert submit.notify == NotifyPattern.NOTIFY_PER_REQUEST
        assert fake_relay.index_of("sub", lambda t: t == topic) < fake_relay.index_of(
            "req", lambda m: m is submit
        )
        fake_relay.wait_for(lambda ev: ("unsub", topic) in ev)
    assert result.request_id == submit.request_id


def test_pattern_can_be_chosen_per_call(
    fake_relay: Any, settings_for: Any, fake_reader: Any
) -> None:
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        c.history(TICKER, "1m", START, END, notify="per_request")
        (submit,) = _submits(fake_relay)
    assert submit.notify == NotifyPattern.NOTIFY_PER_REQUEST
    assert topics.history_ready_topic(submit.request_id) in fake_relay.subscriptions()


def test_rejected_submit_raises_with_server_reason_and_does_not_retry(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    def reject(message: Any) -> Any:
        return kit.Action(
            SubmitResponse(
                request_id=message.request_id,
                status=Status.REJECTED,
                reason="unknown exchange NOPE",
                error_code="bad_ticker",
            )
        )

    fake_relay.handler = reject
    with Client(settings=settings_for(fake_relay, notify="per_request")) as c:
        with pytest.raises(SubmitRejected) as info:
            c.history(TICKER, "1m", START, END)
        (submit,) = _submits(fake_relay)
        topic = topics.history_ready_topic(submit.request_id)
        fake_relay.wait_for(lambda ev: ("unsub", topic) in ev)
    assert info.value.reason == "unknown exchange NOPE"
    assert info.value.error_code == "bad_ticker"
    assert info.value.request_id == submit.request_id


def test_relay_error_reply_to_submit_is_a_rejection(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = lambda m: kit.Action(
        Response(status=Status.REJECTED, reason="cannot decode", error_code="bad_payload")
    )
    with Client(settings=settings_for(fake_relay)) as c, pytest.raises(SubmitRejected) as info:
        c.history(TICKER, "1m", START, END)
    assert info.value.error_code == "bad_payload"


def test_error_notification_raises_history_failed(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = kit.accept_and_notify(
        status=Status.ERROR, reason="exchange said 503", error_code="exchange_unavailable"
    )
    with Client(settings=settings_for(fake_relay)) as c, pytest.raises(HistoryFailed) as info:
        c.history(TICKER, "1m", START, END)
    assert info.value.reason == "exchange said 503"
    assert info.value.error_code == "exchange_unavailable"
    assert len(_submits(fake_relay)) == 1  # an answer, not a reason to retry


def test_not_found_gives_an_empty_frame_without_reading(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    fake_relay.handler = kit.accept_and_notify(status=Status.NOT_FOUND, row_count=0)
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
    assert result.status == "NOT_FOUND" and result.empty
    assert result.to_pandas().columns.tolist()[:3] == ["ticker", "period_seconds", "open_time"]
    assert fake_reader.calls == []


@pytest.mark.parametrize("notify", ["per_client", "per_request"])
def test_lost_notification_is_retried_with_a_new_request_id(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any, notify: str
) -> None:
    good = kit.accept_and_notify()
    seen: list[str] = []

    def drop_first_notification(message: Any) -> Any:
        action = good(message)
        seen.append(message.request_id)
        if len(seen) == 1:
            action.publish = []  # the pipeline's notification never arrives
        return action

    fake_relay.handler = drop_first_notification
    events: list[Any] = []
    settings = settings_for(fake_relay, notify=notify, history_timeout_s=0.5, attempts=3)
    with Client(settings=settings, reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END, progress=events.append)
    first, second = (s.request_id for s in _submits(fake_relay))
    assert first != second
    assert result.request_id == second and result.attempts == 2
    phases = [e.phase for e in events]
    assert "waiting" in phases and "retrying" in phases and phases[-1] == "reading"
    assert {e.attempt for e in events if e.phase == "submitting"} == {1, 2}


def test_every_attempt_timing_out_raises_history_timeout(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    good = kit.accept_and_notify()

    def never_notify(message: Any) -> Any:
        action = good(message)
        action.publish = []
        return action

    fake_relay.handler = never_notify
    settings = settings_for(fake_relay, history_timeout_s=0.3, attempts=2)
    started = time.monotonic()
    with Client(settings=settings, reader=fake_reader) as c, pytest.raises(HistoryTimeout) as info:
        c.history(TICKER, "1m", START, END)
    assert 0.6 <= time.monotonic() - started < 5
    assert info.value.request_ids == tuple(s.request_id for s in _submits(fake_relay))
    assert len(set(info.value.request_ids)) == 2
    asked = [c["request_id"] for c in fake_reader.calls if "request_id" in c]
    first, second = info.value.request_ids
    assert asked == [first, second, first]  # newest accepted attempt first


def test_lost_notification_is_recovered_from_the_requests_table_without_a_resubmit(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    good = kit.accept_and_notify(snapshot_id=77)

    def commit_but_lose_the_notification(message: Any) -> Any:
        action = good(message)
        for _topic, note in action.publish:  # the pipeline recorded it; the PUB lost it
            fake_reader.requests[note.request_id] = {
                "request_id": note.request_id, "status": "OK", "ticker": note.ticker,
                "period_seconds": note.period_seconds, "start_time_ms": note.start_time_ms,
                "end_time_ms": note.end_time_ms, "row_count": 60,
                "iceberg_table": "market.ohlc", "snapshot_id": 77,
            }  # fmt: skip
        action.publish = []
        return action

    fake_relay.handler = commit_but_lose_the_notification
    settings = settings_for(fake_relay, history_timeout_s=0.3, attempts=3)
    with Client(settings=settings, reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
    (submit,) = _submits(fake_relay)  # one submit: the table answered, no second attempt
    assert (result.request_id, result.status, result.snapshot_id) == (submit.request_id, "OK", 77)
    assert result.reported_rows == 60
    assert fake_reader.calls[-1]["snapshot_id"] == 77  # rows read at the recorded snapshot


def test_recorded_error_outcome_raises_history_failed(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    good = kit.accept_and_notify()

    def record_error(message: Any) -> Any:
        action = good(message)
        for _topic, note in action.publish:
            fake_reader.requests[note.request_id] = {
                "request_id": note.request_id, "status": "ERROR",
                "error_code": "bad_symbol", "reason": "binance does not have market symbol",
            }  # fmt: skip
        action.publish = []
        return action

    fake_relay.handler = record_error
    settings = settings_for(fake_relay, history_timeout_s=0.3, attempts=2)
    with Client(settings=settings, reader=fake_reader) as c, pytest.raises(HistoryFailed) as info:
        c.history(TICKER, "1m", START, END)
    assert info.value.error_code == "bad_symbol"
    assert len(_submits(fake_relay)) == 1


def test_late_notification_of_an_earlier_attempt_completes_the_call(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    good = kit.accept_and_notify()
    held: list[Any] = []

    def delay_first(message: Any) -> Any:
        action = good(message)
        if not held:
            held.extend(action.publish)  # first attempt's notification, sent late
            action.publish = []
        else:
            action.publish = held  # second attempt: only the first one's arrives
        return action

    fake_relay.handler = delay_first
    settings = settings_for(fake_relay, history_timeout_s=0.4, attempts=2)
    with Client(settings=settings, reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
    first, _second = _submits(fake_relay)
    assert result.request_id == first.request_id


def test_lost_submit_reply_recreates_the_req_socket_and_retries(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    good = kit.accept_and_notify()
    calls: list[str] = []

    def drop_first_reply(message: Any) -> Any:
        calls.append(message.request_id)
        action = good(message)
        return kit.Action(None) if len(calls) == 1 else action

    fake_relay.handler = drop_first_reply
    settings = settings_for(fake_relay, submit_timeout_s=0.3, attempts=2)
    with Client(settings=settings, reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
        assert c._transport.requests.resets == 1
    assert result.request_id == calls[1] != calls[0]


def test_relay_that_never_acks_gives_request_timeout(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = lambda m: kit.Action(None)
    settings = settings_for(fake_relay, submit_timeout_s=0.2, attempts=2)
    with Client(settings=settings) as c, pytest.raises(RequestTimeout):
        c.history(TICKER, "1m", START, END)
    assert len(_submits(fake_relay)) == 2


def test_topic_mismatch_in_submit_response_is_a_protocol_error(
    fake_relay: Any, settings_for: Any, kit: Any
) -> None:
    fake_relay.handler = lambda m: kit.Action(
        SubmitResponse(
            request_id=m.request_id, status=Status.OK, notification_topic="RESPONSE:someone"
        )
    )
    with Client(settings=settings_for(fake_relay)) as c, pytest.raises(ProtocolMismatch):
        c.history(TICKER, "1m", START, END)


def test_two_clients_same_ticker_get_only_their_own_notifications(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    """`alice` is a prefix of `alice2`: ZeroMQ delivers alice2's topic to alice too."""
    good = kit.accept_and_notify()
    pending: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def hold_until_both(message: Any) -> Any:
        action = good(message)
        with lock:
            pending.extend(action.publish)
            if len(pending) < 2:
                action.publish = []
            else:  # alice2's first, so alice sees a foreign one before her own
                action.publish = sorted(pending, key=lambda p: p[0] != "RESPONSE:alice2")
        return action

    fake_relay.handler = hold_until_both
    results: dict[str, Any] = {}
    clients = {
        name: Client(settings=settings_for(fake_relay, client_id=name), reader=fake_reader)
        for name in ("alice", "alice2")
    }

    def run(name: str) -> None:
        results[name] = clients[name].history(TICKER, "1m", START, END)

    threads = [threading.Thread(target=run, args=(name,)) for name in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    try:
        by_client = {s.client_id: s.request_id for s in _submits(fake_relay)}
        assert results["alice"].request_id == by_client["alice"]
        assert results["alice2"].request_id == by_client["alice2"]
        assert clients["alice"].dispatch_stats.get("unclaimed_notification", 0) >= 1
    finally:
        for client in clients.values():
            client.close()


def test_unreachable_relay_raises_relay_unavailable() -> None:
    settings = ClientSettings(
        request_endpoint="tcp://127.0.0.1:9",
        market_data_endpoint="tcp://127.0.0.1:9",
        connect_timeout_s=0.3,
    )
    started = time.monotonic()
    with pytest.raises(RelayUnavailable):
        Client(settings=settings)
    assert time.monotonic() - started < 3


def test_relay_gone_after_connect_fails_fast_and_leaves_no_subscription(
    fake_relay: Any, settings_for: Any
) -> None:
    settings = settings_for(fake_relay, notify="per_request", connect_timeout_s=0.5)
    with Client(settings=settings) as c:
        subscriber = c._transport.subscriber
        fake_relay.close()
        deadline = time.monotonic() + 5
        while subscriber.connected and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the monitor-driven state, bounded
        assert not subscriber.connected
        with pytest.raises(RelayUnavailable):
            c.history(TICKER, "1m", START, END)
        assert subscriber._counts == {}  # the failed subscribe was taken back


def test_status_tells_a_running_request_from_one_never_seen(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    """Issue 47: an id never submitted said PENDING, like a running request. The outcome
    comes from the requests table; without one, the relay that acked the submit says
    PENDING, and UNKNOWN when no relay remembers the id."""
    fake_relay.handler = kit.ack_only()
    with Client(settings=settings_for(fake_relay), reader=fake_reader) as c:
        with pytest.raises(HistoryTimeout):
            c.history(TICKER, "1m", START, END, timeout_s=0.2, attempts=1)
        (submit,) = _submits(fake_relay)
        running = c.status(submit.request_id)
        never = c.status("never-submitted")
        fake_reader.requests[submit.request_id] = {
            "request_id": submit.request_id, "status": "OK", "ticker": TICKER,
            "period_seconds": 60, "start_time_ms": START, "end_time_ms": END, "row_count": 60,
        }  # fmt: skip
        done = c.status(submit.request_id)
        with pytest.raises(InvalidRequest):
            c.status("not an id")
    assert (running.state, running.accepted_at_ms, running.remembered_s) == (
        "PENDING",
        1_795_132_800_000,
        86_400,
    )
    assert (never.state, never.notification, never.remembered_s) == ("UNKNOWN", None, 86_400)
    assert (done.state, done.done) == ("OK", True)
    queries = [m for m in fake_relay.requests if isinstance(m, RequestStatusQuery)]
    assert [q.request_id for q in queries] == [submit.request_id, "never-submitted"]  # not done


def test_status_asks_every_relay_and_a_silent_one_makes_no_unknown(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    """Two relays (active/active): a submit went to one of them, so each is asked; one
    that does not answer may be the one that accepted it, so no UNKNOWN is made up."""
    other = kit.FakeRelay()
    try:
        fake_relay.handler = other.handler = kit.ack_only()
        settings = settings_for(
            fake_relay,
            request_endpoint=f"{other.request_endpoint},{fake_relay.request_endpoint}",
            market_data_endpoint=f"{other.market_data_endpoint},{fake_relay.market_data_endpoint}",
            connect_timeout_s=1.0,
        )
        with Client(settings=settings, reader=fake_reader) as c:
            with pytest.raises(HistoryTimeout):  # submitted to `other`, the first listed
                c.history(TICKER, "1m", START, END, timeout_s=0.2, attempts=1)
            (submit,) = _submits(other)
            assert c.status(submit.request_id).state == "PENDING"  # `other` remembers it
            assert c.status("never-submitted").state == "UNKNOWN"  # neither does
            other.close()  # silent from now on: it may be the one that accepted an id
            for request_id in (submit.request_id, "never-submitted"):
                with pytest.raises(RequestTimeout):
                    c.status(request_id)
    finally:
        other.close()
