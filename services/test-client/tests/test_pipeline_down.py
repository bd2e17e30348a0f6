"""A history request in flight when the pipeline stops: it ends at the relay's down
report on `PIPELINE:status` with `pipeline_unavailable`, not at the history timeout.

The rule (mdclient.history.PipelineView) with a hand clock, then the SDK and the CLI
against the fake relay, which acks the submit and then publishes on `PIPELINE:status`
what a relay publishes once the pipeline's heartbeat is overdue.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message

from mdclient import Client, PipelineUnavailable
from mdclient.cli import main
from mdclient.exit_codes import ExitCode
from mdclient.history import PipelineView
from mdproto import topics
from mdproto.error_codes import PIPELINE_UNAVAILABLE
from mdproto.messages import PipelineStatus, Status

TICKER = "BINANCE:BTC/USDT"
START = 1_795_132_800_000
END = START + 3_600_000
DOWN = PipelineStatus(
    interval_ms=1000,
    history=False,
    triggers=False,
    reason="relay: the pipeline's last heartbeat came 5.3 s ago: it is hung",
)


def serving(interval_ms: int = 1000) -> PipelineStatus:
    return PipelineStatus(interval_ms=interval_ms, history=True, triggers=True)


# --- the rule, pure -------------------------------------------------------------------


def test_a_down_report_ends_the_wait_with_its_reason() -> None:
    assert PipelineView().down(DOWN, now=0.0) == DOWN.reason
    assert PipelineView().down(PipelineStatus(), now=0.0) == "the pipeline does not serve history"


def test_a_serving_heartbeat_outweighs_a_down_report_for_two_intervals() -> None:
    """Another relay still passes the heartbeat on: the reporting one lost its link only."""
    view = PipelineView()
    assert view.down(serving(), now=10.0) is None
    assert view.down(DOWN, now=12.0) is None
    assert view.down(DOWN, now=12.01) == DOWN.reason


# --- the SDK and the CLI against the fake relay ------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONFIG_PATH", raising=False)


def ack_then(kit: Any, *published: PipelineStatus, answer: bool = False) -> Any:
    """Handler: SubmitResponse OK, then `published` on PIPELINE:status in order, then
    the notification if `answer`."""
    notify = kit.accept_and_notify()

    def handle(message: Message) -> Any:
        action = notify(message)
        notes = action.publish if answer else []
        action.publish = [(topics.PIPELINE_STATUS, m) for m in published] + notes
        return action

    return handle


@pytest.mark.parametrize("notify", ["per_client", "per_request"])
def test_a_request_in_flight_ends_at_the_down_report(
    fake_relay: Any, settings_for: Any, kit: Any, notify: str
) -> None:
    fake_relay.handler = ack_then(kit, DOWN)
    settings = settings_for(fake_relay, notify=notify, history_timeout_s=20.0, attempts=1)
    with Client(settings=settings) as c, pytest.raises(PipelineUnavailable) as info:
        c.history(TICKER, "1m", START, END)
    (submit,) = fake_relay.requests
    assert info.value.error_code == PIPELINE_UNAVAILABLE
    assert info.value.request_id == submit.request_id
    assert DOWN.reason in info.value.reason and "retry once it runs" in info.value.reason
    assert fake_relay.index_of("sub", lambda t: t == topics.PIPELINE_STATUS) < (
        fake_relay.index_of("req", lambda m: True)
    )
    fake_relay.wait_for(lambda ev: ("unsub", topics.PIPELINE_STATUS) in ev)


def test_a_down_report_right_after_a_serving_heartbeat_does_not_fail_the_request(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any
) -> None:
    fake_relay.handler = ack_then(kit, serving(interval_ms=600_000), DOWN, answer=True)
    settings = settings_for(fake_relay, history_timeout_s=20.0, attempts=1)
    with Client(settings=settings, reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
    assert result.status == Status.Name(Status.OK)


def test_the_cli_exits_4_with_pipeline_unavailable(fake_relay: Any, capsys: Any, kit: Any) -> None:
    fake_relay.handler = ack_then(kit, DOWN)
    code = main([
        "history", TICKER, "--start", "2026-11-20T00:00", "--end", "2026-11-20T01:00",
        "--timeout", "20", "--attempts", "1",
        "--request-endpoint", fake_relay.request_endpoint,
        "--market-data-endpoint", fake_relay.market_data_endpoint,
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED
    assert "PipelineUnavailable" in err and f"[{PIPELINE_UNAVAILABLE}]" in err
