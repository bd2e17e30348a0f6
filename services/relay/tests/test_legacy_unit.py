"""The legacy pending map, with an injected clock."""

from __future__ import annotations

from mdproto.messages import OHLC, DataResponse, Status
from relay.legacy import Admission, PendingRequests, response_from, timeout_response


def test_added_request_is_resolved_once() -> None:
    pending = PendingRequests(capacity=10, timeout=30)
    assert pending.add("r1", [b"id", b""], now=100.0) is Admission.ADDED
    assert len(pending) == 1
    found = pending.resolve("r1")
    assert found is not None and found.route == [b"id", b""]
    assert pending.resolve("r1") is None  # a second (competing) ingestor's answer
    assert len(pending) == 0


def test_requests_expire_in_deadline_order() -> None:
    pending = PendingRequests(capacity=10, timeout=30)
    pending.add("r1", [b"a"], now=0.0)
    pending.add("r2", [b"b"], now=10.0)
    assert pending.next_deadline() == 30.0
    assert pending.expire(29.9) == []
    assert [p.request_id for p in pending.expire(30.0)] == ["r1"]
    assert pending.next_deadline() == 40.0
    assert [p.request_id for p in pending.expire(100.0)] == ["r2"]
    assert pending.next_deadline() is None


def test_map_is_bounded_and_refuses_duplicates() -> None:
    pending = PendingRequests(capacity=2, timeout=30)
    assert pending.add("r1", [b"a"], 0.0) is Admission.ADDED
    assert pending.add("r1", [b"b"], 0.0) is Admission.DUPLICATE
    assert pending.add("r2", [b"a"], 0.0) is Admission.ADDED
    assert pending.add("r3", [b"a"], 0.0) is Admission.FULL
    pending.resolve("r1")
    assert pending.add("r3", [b"a"], 0.0) is Admission.ADDED


def test_response_carries_status_reason_and_candles() -> None:
    candle = OHLC(ticker="BINANCE:BTC/USDT", period_seconds=60, open=1.0, close=2.0)
    data = DataResponse(request_id="r1", status=Status.NOT_FOUND, reason="none", candles=[candle])
    response = response_from(data)
    assert (response.request_id, response.status, response.reason) == (
        "r1",
        Status.NOT_FOUND,
        "none",
    )
    assert list(response.candles) == [candle]
    assert response_from(DataResponse(request_id="r1")).status == Status.ERROR


def test_timeout_response() -> None:
    pending = PendingRequests(capacity=1, timeout=30)
    pending.add("r1", [b"a"], 0.0)
    (expired,) = pending.expire(31.0)
    response = timeout_response(expired, 30)
    assert response.status == Status.TIMEOUT
    assert response.error_code == "timeout"
    assert response.request_id == "r1"
