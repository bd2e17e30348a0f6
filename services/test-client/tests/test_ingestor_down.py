"""A history request in flight when the last ingestor of its exchange dies or hangs: it
ends at the relay's word on `INGESTORS:{exchange}|status` with `no_ingestor`, not at
the history timeout; while another ingestor still serves the exchange nothing ends.

The rule (mdclient.history.ServingView) with a hand clock, then the SDK against the
fake relay, which acks the submit and then publishes what a relay publishes once no
live ingestor of the exchange is left (services/relay/tests/test_exchange_serving.py
runs a real relay).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message

from mdclient import Client, IngestorUnavailable
from mdclient.cli import main
from mdclient.exit_codes import ExitCode
from mdclient.history import ServingView
from mdproto import topics
from mdproto.error_codes import NO_INGESTOR
from mdproto.messages import ExchangeServing, Status

TICKER = "BINANCE:BTC/USDT"
START = 1_795_132_800_000
END = START + 3_600_000
WATCHED = topics.ingestors_status_topic("BINANCE")
DOWN = ExchangeServing(
    exchange="BINANCE",
    served=False,
    error_code=NO_INGESTOR,
    reason="relay: no ingestor of BINANCE is alive: the last status came 6.1 s ago",
    interval_ms=1000,
)


def served(interval_ms: int = 1000) -> ExchangeServing:
    return ExchangeServing(exchange="BINANCE", served=True, alive=1, interval_ms=interval_ms)


# --- the rule, pure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([(0.0, DOWN)], DOWN.reason),
        ([(0.0, ExchangeServing(exchange="BINANCE"))], "no live ingestor serves BINANCE"),
        # another relay still hears an ingestor: the reporting one lost its own link only
        ([(10.0, served()), (12.0, DOWN)], None),
        ([(10.0, served()), (12.0, DOWN), (12.01, DOWN)], DOWN.reason),
    ],
)
def test_a_down_word_ends_the_wait_unless_served_within_two_intervals(
    words: list[tuple[float, ExchangeServing]], expected: str | None
) -> None:
    view = ServingView()
    said = [view.down(word, now=at) for at, word in words]
    assert said[-1] == expected and not any(said[:-1])


# --- the SDK against the fake relay ------------------------------------------------------


def ack_then(kit: Any, *published: tuple[str, Message], answer: bool = False) -> Any:
    """Handler: SubmitResponse OK, then `published` in order, then the notification if
    `answer`."""
    notify = kit.accept_and_notify()

    def handle(message: Message) -> Any:
        action = notify(message)
        notes = action.publish if answer else []
        action.publish = [*published, *notes]
        return action

    return handle


@pytest.mark.parametrize("notify", ["per_client", "per_request"])
def test_a_request_in_flight_ends_when_no_ingestor_is_left(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any, notify: str
) -> None:
    fake_relay.handler = ack_then(kit, (WATCHED, DOWN))
    settings = settings_for(fake_relay, notify=notify, history_timeout_s=20.0, attempts=1)
    with (
        Client(settings=settings, reader=fake_reader) as c,
        pytest.raises(IngestorUnavailable) as info,
    ):
        c.history(TICKER, "1m", START, END)
    (submit,) = fake_relay.requests
    assert info.value.error_code == NO_INGESTOR
    assert info.value.request_id == submit.request_id
    assert DOWN.reason in info.value.reason and "retry once one runs" in info.value.reason
    assert fake_relay.index_of("sub", lambda t: t == WATCHED) < (
        fake_relay.index_of("req", lambda m: True)
    )
    assert [call["request_id"] for call in fake_reader.calls] == [submit.request_id]
    fake_relay.wait_for(lambda ev: ("unsub", WATCHED) in ev)


@pytest.mark.parametrize(
    "words",
    [
        [(topics.ingestors_status_topic("OKX"), ExchangeServing(exchange="OKX"))],
        [(WATCHED, served(interval_ms=600_000)), (WATCHED, DOWN)],  # another relay serves
    ],
    ids=["another exchange down", "down right after served"],
)
def test_words_that_end_nothing(
    fake_relay: Any, settings_for: Any, fake_reader: Any, kit: Any, words: Any
) -> None:
    fake_relay.handler = ack_then(kit, *words, answer=True)
    settings = settings_for(fake_relay, history_timeout_s=20.0, attempts=1)
    with Client(settings=settings, reader=fake_reader) as c:
        assert c.history(TICKER, "1m", START, END).status == Status.Name(Status.OK)


def test_an_outcome_recorded_before_the_ingestor_died_is_the_answer(
    fake_relay: Any,
    settings_for: Any,
    fake_reader: Any,
    kit: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ingestor finished (the pipeline recorded the outcome) and then died."""
    monkeypatch.setattr("mdclient.client.new_request_id", lambda: "finished-1")
    fake_reader.requests["finished-1"] = {
        "request_id": "finished-1", "status": "OK", "ticker": TICKER, "period_seconds": 60,
        "start_time_ms": START, "end_time_ms": END, "row_count": 60,
    }  # fmt: skip
    fake_relay.handler = ack_then(kit, (WATCHED, DOWN))
    settings = settings_for(fake_relay, history_timeout_s=20.0, attempts=1)
    with Client(settings=settings, reader=fake_reader) as c:
        result = c.history(TICKER, "1m", START, END)
    assert (result.status, result.request_id) == (Status.Name(Status.OK), "finished-1")


def test_the_cli_exits_4_with_no_ingestor(
    fake_relay: Any, capsys: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configured through the environment this time (MDCLIENT_*)."""
    monkeypatch.delenv("CONFIG_PATH", raising=False)
    for name, value in {
        "REQUEST_ENDPOINT": fake_relay.request_endpoint,
        "MARKET_DATA_ENDPOINT": fake_relay.market_data_endpoint,
        "HISTORY_TIMEOUT_S": "20",
        "ATTEMPTS": "1",
        "RECOVER_FROM_TABLE": "false",  # no catalog here
    }.items():
        monkeypatch.setenv(f"MDCLIENT_{name}", value)
    fake_relay.handler = ack_then(kit, (WATCHED, DOWN))
    code = main(["history", TICKER, "--start", "2026-11-20T00:00", "--end", "2026-11-20T01:00"])
    err = capsys.readouterr().err
    (submit,) = fake_relay.requests
    assert code == ExitCode.FAILED
    assert "IngestorUnavailable" in err and f"[{NO_INGESTOR}]" in err
    assert submit.request_id in err
