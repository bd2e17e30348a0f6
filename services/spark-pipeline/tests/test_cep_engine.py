"""The CEP engine on hand-crafted tick sequences: each kind fires exactly when expected."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence

import pytest

from mdproto.messages import CEPCondition, CEPTriggerEvent, CEPTriggerRequest, NotifyPattern
from pipeline.cep.engine import Engine
from pipeline.cep.model import InvalidTrigger, Notice, NoticeKind, TriggerSpec, spec_from_request

TICKER = "BINANCE:BTC/USDT"
T0 = 1_700_000_040_000  # a minute boundary
S = 1000
_ids = itertools.count()

ABOVE, BELOW = CEPCondition.PRICE_ABOVE, CEPCondition.PRICE_BELOW
PCT, VOLUME = CEPCondition.PCT_MOVE, CEPCondition.VOLUME_OVER


def spec(
    *conditions: tuple[int, float] | tuple[int, float, int],
    trigger_id: str = "t1",
    period: int = 0,
    within: int = 0,
    repeating: bool = False,
    expires_at_ms: int = 0,
    ticker: str = TICKER,
) -> TriggerSpec:
    request = CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id="alice",
        action=CEPTriggerRequest.REGISTER,
        ticker=ticker,
        period_seconds=period,
        conditions=[
            CEPCondition(kind=c[0], threshold=c[1], window_seconds=c[2] if len(c) > 2 else 0)
            for c in conditions
        ],
        within_seconds=within,
        repeating=repeating,
        expires_at_ms=expires_at_ms,
        notify=NotifyPattern.NOTIFY_PER_REQUEST,
    )
    return spec_from_request(request, registered_ms=T0)


def feed(
    engine: Engine,
    ticks: Sequence[tuple[float, float, float]],
    *,
    ticker: str = TICKER,
    now_ms: int = T0,
) -> list[Notice]:
    """Ticks as (seconds after T0, price, amount), each with a fresh trade id."""
    out: list[Notice] = []
    for seconds, price, amount in ticks:
        t = T0 + int(seconds * S)
        out += engine.on_tick(ticker, str(next(_ids)), t, price, amount, now_ms)
    return out


def fired(notices: Sequence[Notice]) -> list[Notice]:
    return [n for n in notices if n.kind is NoticeKind.FIRED]


def armed(engine: Engine, trigger: TriggerSpec) -> None:
    [notice] = engine.register(trigger, T0)
    assert notice.kind is NoticeKind.ARMED and not notice.final


# --- PRICE_ABOVE / PRICE_BELOW -------------------------------------------------------


def test_price_above_fires_once_when_crossing_strictly_above() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0)))
    assert fired(feed(engine, [(0, 99, 1), (1, 100, 1)])) == []  # at the threshold: not above
    [fire] = fired(feed(engine, [(2, 100.5, 1)]))
    assert fire.values == {"price": 100.5, "prev_price": 100.0, "threshold": 100.0}
    assert (fire.event_time_ms, fire.fire_count, fire.final) == (T0 + 2 * S, 1, True)
    assert fire.topic == "CEP:t1"
    assert engine.drain_retired() == ["t1"] and "t1" not in engine
    assert fired(feed(engine, [(3, 99, 1), (4, 101, 1)])) == []  # one-shot: done


def test_price_above_needs_a_previous_price_below() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0)))
    assert fired(feed(engine, [(0, 105, 1), (1, 106, 1)])) == []  # never was at/below
    assert len(fired(feed(engine, [(2, 99, 1), (3, 101, 1)]))) == 1


def test_price_known_before_registration_counts_as_previous() -> None:
    engine = Engine()
    feed(engine, [(0, 99, 1)])  # nobody watches yet: only the last price is kept
    armed(engine, spec((ABOVE, 100.0)))
    assert len(fired(feed(engine, [(1, 101, 1)]))) == 1


def test_repeating_price_above_rearms_only_after_going_back_below() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0), repeating=True))
    notices = fired(feed(engine, [(0, 99, 1), (1, 101, 1), (2, 102, 1), (3, 103, 1)]))
    assert [(n.fire_count, n.final) for n in notices] == [(1, False)]
    notices = fired(feed(engine, [(4, 99.5, 1), (5, 100.01, 1)]))
    assert [(n.fire_count, n.final) for n in notices] == [(2, False)]
    assert "t1" in engine and engine.drain_retired() == []


def test_price_below_fires_when_crossing_strictly_below() -> None:
    engine = Engine()
    armed(engine, spec((BELOW, 100.0)))
    assert fired(feed(engine, [(0, 101, 1), (1, 100, 1)])) == []
    [fire] = fired(feed(engine, [(2, 99.9, 1)]))
    assert fire.values["price"] == 99.9 and fire.values["prev_price"] == 100.0


def test_one_jump_fires_every_crossed_threshold_and_no_other() -> None:
    engine = Engine()
    for i, threshold in enumerate([100.0, 105.0, 110.0]):
        engine.register(spec((ABOVE, threshold), trigger_id=f"a{i}"), T0)
    engine.register(spec((BELOW, 98.0), trigger_id="b"), T0)
    notices = fired(feed(engine, [(0, 99, 1), (1, 107, 1)]))
    assert sorted(n.trigger_id for n in notices) == ["a0", "a1"]


# --- PCT_MOVE --------------------------------------------------------------------------


def test_pct_move_up_fires_at_the_threshold_within_the_window() -> None:
    engine = Engine()
    armed(engine, spec((PCT, 5.0, 60)))
    assert fired(feed(engine, [(0, 100, 1), (10, 103, 1), (20, 104.99, 1)])) == []
    [fire] = fired(feed(engine, [(30, 105, 1)]))
    assert fire.values["pct"] == pytest.approx(5.0)
    assert fire.values["ref_price"] == 100.0 and fire.values["window_s"] == 60.0
    assert fire.final


def test_pct_move_down_reports_a_negative_move_from_the_high() -> None:
    engine = Engine()
    armed(engine, spec((PCT, 5.0, 60)))
    assert fired(feed(engine, [(0, 100, 1), (10, 96, 1)])) == []
    [fire] = fired(feed(engine, [(20, 94.9, 1)]))
    assert fire.values["pct"] == pytest.approx(-5.1)
    assert fire.values["ref_price"] == 100.0


def test_pct_move_spread_over_more_than_the_window_does_not_fire() -> None:
    engine = Engine()
    armed(engine, spec((PCT, 5.0, 60)))
    # +4.9% in 30 s, then +3% more 40 s later: 100 has left the window by then.
    assert fired(feed(engine, [(0, 100, 1), (30, 104.9, 1), (70, 108, 1)])) == []


def test_repeating_pct_move_fires_again_only_after_the_move_fell_below() -> None:
    engine = Engine()
    armed(engine, spec((PCT, 5.0, 60), repeating=True))
    assert len(fired(feed(engine, [(0, 100, 1), (10, 106, 1), (20, 107, 1)]))) == 1
    # 100 leaves the window at 60 s: the move (vs 106) is ~1%; then +6% again.
    assert fired(feed(engine, [(61, 107, 1)])) == []
    [fire] = fired(feed(engine, [(100, 113.5, 1)]))
    assert fire.fire_count == 2 and fire.values["ref_price"] == 107.0


# --- VOLUME_OVER ---------------------------------------------------------------------


def test_volume_over_fires_when_the_window_sum_reaches_the_threshold() -> None:
    engine = Engine()
    armed(engine, spec((VOLUME, 10.0, 60)))
    assert fired(feed(engine, [(0, 100, 4), (10, 100, 5)])) == []
    [fire] = fired(feed(engine, [(20, 100, 1)]))
    assert fire.values == {"volume": 10.0, "window_s": 60.0, "threshold": 10.0}


def test_volume_spread_over_more_than_the_window_does_not_fire() -> None:
    engine = Engine()
    armed(engine, spec((VOLUME, 10.0, 60)))
    assert fired(feed(engine, [(0, 100, 6), (60, 100, 5), (120.5, 100, 4.5)])) == []


def test_repeating_volume_over_fires_again_after_the_window_drained() -> None:
    engine = Engine()
    armed(engine, spec((VOLUME, 10.0, 60), repeating=True))
    first = fired(feed(engine, [(0, 100, 6), (10, 100, 5), (30, 100, 1)]))
    assert [n.values["volume"] for n in first] == [11.0]
    # At 65 s the 6 left: 5 + 1 + 2 = 8 < 10; at 80 s the 5 left too: 1 + 2 + 8 = 11.
    assert fired(feed(engine, [(65, 100, 2)])) == []
    [again] = fired(feed(engine, [(80, 100, 8)]))
    assert (again.fire_count, again.values["volume"]) == (2, 11.0)


def test_duplicate_trades_are_not_counted_twice() -> None:
    engine = Engine()
    armed(engine, spec((VOLUME, 10.0, 60)))
    for _ in range(3):
        assert engine.on_tick(TICKER, "same", T0, 100.0, 6.0, T0) == []
    assert engine.stats["duplicates"] == 2


# --- sequences ---------------------------------------------------------------------------


def test_sequence_fires_when_the_second_edge_follows_within_the_bound() -> None:
    engine = Engine()
    armed(engine, spec((BELOW, 95.0), (ABOVE, 100.0), within=60))
    assert fired(feed(engine, [(0, 97, 1), (10, 94, 1), (20, 96, 1)])) == []
    [fire] = fired(feed(engine, [(40, 101, 1)]))
    assert fire.values["first_price"] == 94.0 and fire.values["price"] == 101.0
    assert fire.values["first_time_ms"] == T0 + 10 * S
    assert fire.event_time_ms == T0 + 40 * S and fire.final


def test_sequence_second_edge_too_late_does_not_fire() -> None:
    engine = Engine()
    armed(engine, spec((BELOW, 95.0), (ABOVE, 100.0), within=60))
    assert fired(feed(engine, [(0, 97, 1), (10, 94, 1), (71, 101, 1)])) == []
    # A fresh first edge starts a new attempt.
    assert fired(feed(engine, [(80, 94, 1)])) == []
    assert len(fired(feed(engine, [(90, 100.5, 1)]))) == 1


def test_sequence_second_edge_before_the_first_does_not_count() -> None:
    engine = Engine()
    armed(engine, spec((BELOW, 95.0), (ABOVE, 100.0), within=60))
    assert fired(feed(engine, [(0, 99, 1), (5, 101, 1), (10, 94, 1)])) == []


def test_sequence_never_completes_on_the_point_that_started_it() -> None:
    engine = Engine()
    armed(engine, spec((VOLUME, 5.0, 60), (ABOVE, 100.0), within=30))
    # One tick is both the volume edge and the price crossing: not a sequence.
    assert fired(feed(engine, [(0, 99, 1), (1, 101, 10)])) == []
    assert len(fired(feed(engine, [(2, 99, 0), (3, 101.5, 0)]))) == 1


def test_repeating_sequence_needs_a_new_first_edge_each_time() -> None:
    engine = Engine()
    armed(engine, spec((BELOW, 95.0), (ABOVE, 100.0), within=60, repeating=True))
    ticks = [(0, 97, 1), (1, 94, 1), (2, 101, 1), (3, 99, 1), (4, 101, 1)]
    assert [n.fire_count for n in fired(feed(engine, ticks))] == [1]
    assert [n.fire_count for n in fired(feed(engine, [(5, 94, 1), (6, 102, 1)]))] == [2]


# --- candles ---------------------------------------------------------------------------


def test_candle_trigger_sees_closes_only_when_a_candle_closes() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0), period=60))
    # Minute 0 closes at 99; minute 1 trades above 100 but has not closed yet.
    assert fired(feed(engine, [(1, 99, 1), (59, 99, 1), (61, 101, 1), (100, 102, 1)])) == []
    [fire] = fired(feed(engine, [(121, 98, 1)]))  # closes minute 1 at 102
    assert fire.event_time_ms == T0 + 120 * S
    assert fire.values["price"] == 102.0 and fire.values["prev_price"] == 99.0
    assert fire.values["candle_open_time_ms"] == T0 + 60 * S


def test_an_idle_candle_closes_by_processing_time_after_the_grace() -> None:
    engine = Engine(candle_grace_ms=2000)
    armed(engine, spec((VOLUME, 10.0, 120), period=60, repeating=True))
    assert fired(feed(engine, [(1, 100, 4), (61, 100, 7)])) == []  # closes minute 0 (4)
    assert engine.advance(T0 + 121 * S) == []  # minute 1 ends at 120 s: grace not over
    [fire] = fired(engine.advance(T0 + 122 * S))
    assert fire.values["volume"] == 11.0 and fire.event_time_ms == T0 + 120 * S
    assert engine.on_tick(TICKER, "late", T0 + 119 * S, 100, 50, T0) == []
    assert engine.stats["late"] == 1


# --- expiry and cancel -------------------------------------------------------------------


def test_expiry_is_announced_once_and_stops_evaluation() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0), repeating=True, expires_at_ms=T0 + 5 * S))
    assert engine.advance(T0 + 4999) == []
    [notice] = engine.advance(T0 + 5 * S)
    assert (notice.kind, notice.final, notice.fire_count) == (NoticeKind.EXPIRED, True, 0)
    assert engine.advance(T0 + 10 * S) == []
    assert feed(engine, [(6, 99, 1), (7, 101, 1)], now_ms=T0 + 7 * S) == []
    assert engine.drain_retired() == ["t1"]


def test_a_tick_processed_after_expiry_expires_instead_of_firing() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0), expires_at_ms=T0 + 5 * S))
    notices = feed(engine, [(0, 99, 1), (1, 101, 1)], now_ms=T0 + 6 * S)
    assert [n.kind for n in notices] == [NoticeKind.EXPIRED]


def test_registering_an_already_expired_trigger_expires_it_at_once() -> None:
    engine = Engine()
    [notice] = engine.register(spec((ABOVE, 100.0), expires_at_ms=T0 - 1), T0)
    assert notice.kind is NoticeKind.EXPIRED and "t1" not in engine


def test_cancel_stops_evaluation_and_is_announced_once() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0), repeating=True))
    assert len(fired(feed(engine, [(0, 99, 1), (1, 101, 1)]))) == 1
    [notice] = engine.cancel("t1", T0 + 2 * S)
    assert (notice.kind, notice.final, notice.fire_count) == (NoticeKind.CANCELLED, True, 1)
    assert engine.cancel("t1", T0 + 3 * S) == []
    assert feed(engine, [(4, 99, 1), (5, 101, 1)]) == []
    assert engine.drain_retired() == []  # a client's cancel is already in Kafka


def test_registering_an_id_again_replaces_the_trigger() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0)))
    armed(engine, spec((ABOVE, 200.0)))
    assert len(engine) == 1
    assert fired(feed(engine, [(0, 99, 1), (1, 101, 1)])) == []
    assert len(fired(feed(engine, [(2, 201, 1)]))) == 1


def test_triggers_on_other_tickers_are_untouched() -> None:
    engine = Engine()
    armed(engine, spec((ABOVE, 100.0)))
    assert feed(engine, [(0, 99, 1), (1, 101, 1)], ticker="BINANCE:ETH/USDT") == []


# --- scale and state -------------------------------------------------------------------------


def test_ten_thousand_triggers_fire_exactly_the_crossed_ones() -> None:
    engine = Engine()
    for i in range(10_000):
        engine.register(spec((ABOVE, 100.0 + i * 0.01), trigger_id=f"t{i}"), T0)
    feed(engine, [(0, 100.0, 1)])
    notices = fired(feed(engine, [(1, 100.505, 1)]))  # from 100.00 (at: counts) to 100.50
    assert sorted(int(n.trigger_id[1:]) for n in notices) == list(range(51))
    assert len(engine) == 10_000 - 51


def test_a_pickled_engine_continues_exactly_where_it_stopped() -> None:
    engine = Engine()
    armed(engine, spec((VOLUME, 10.0, 60), trigger_id="v", repeating=True))
    armed(engine, spec((BELOW, 95.0), (ABOVE, 100.0), trigger_id="s", within=60))
    feed(engine, [(0, 97, 6), (1, 94, 3)])  # volume 9, sequence half done
    restored: Engine = pickle.loads(pickle.dumps(engine))
    restored.restore_definitions(engine.definitions())  # what SnapshotStore does
    for candidate in (engine, restored):
        notices = fired(feed(candidate, [(2, 101, 1)]))
        assert sorted(n.trigger_id for n in notices) == ["s", "v"]


def test_notice_becomes_a_trigger_event() -> None:
    engine = Engine()
    engine.register(spec((ABOVE, 100.0)), T0)
    [fire] = fired(feed(engine, [(0, 99, 1), (1, 101, 1)]))
    message = fire.to_message()
    assert isinstance(message, CEPTriggerEvent)
    assert message.kind == CEPTriggerEvent.FIRED and message.final
    assert message.values["price"] == 101.0 and message.fire_count == 1


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"trigger_id": ""}, "trigger_id"),
        ({"ticker": "BTCUSDT"}, "EXCHANGE:BASE/QUOTE"),
        ({"conditions": []}, "one condition"),
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=1)] * 3}, "one condition"),
        ({"conditions": [CEPCondition(kind=99, threshold=1)]}, "unknown kind"),
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=0)]}, "threshold"),
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=float("nan"))]}, "threshold"),
        ({"conditions": [CEPCondition(kind=PCT, threshold=1)]}, "window_seconds"),
        ({"conditions": [CEPCondition(kind=ABOVE, threshold=1)] * 2}, "within_seconds"),
        ({"action": CEPTriggerRequest.CANCEL}, "REGISTER"),
        ({"notify": NotifyPattern.NOTIFY_PER_CLIENT, "client_id": ""}, "client_id"),
    ],
)
def test_invalid_records_are_refused_with_a_reason(changes: dict[str, object], needle: str) -> None:
    fields: dict[str, object] = {
        "trigger_id": "t1",
        "action": CEPTriggerRequest.REGISTER,
        "ticker": TICKER,
        "conditions": [CEPCondition(kind=ABOVE, threshold=1)],
    }
    fields.update(changes)
    with pytest.raises(InvalidTrigger, match=needle):
        spec_from_request(CEPTriggerRequest(**fields))  # type: ignore[arg-type]


def test_event_topic_follows_notify() -> None:
    request = CEPTriggerRequest(
        trigger_id="t9",
        client_id="bob",
        action=CEPTriggerRequest.REGISTER,
        ticker=TICKER,
        conditions=[CEPCondition(kind=ABOVE, threshold=1)],
    )
    assert spec_from_request(request).topic == "RESPONSE:bob"
    request.notify = NotifyPattern.NOTIFY_PER_REQUEST
    assert spec_from_request(request).topic == "CEP:t9"


def test_trade_id_memory_of_a_snapshot_from_before_the_shared_class_is_read() -> None:
    """Snapshots pickle the engine's trade-id memory; those written while it was the
    engine's own class (slots `_order`, `_seen`, `capacity`) must still restore."""
    import copyreg
    import io
    from collections import deque

    from pipeline.cep import engine as engine_module

    class Written:  # what the old class held
        state = {"_order": deque(["a", "b"]), "_seen": {"a", "b"}, "capacity": 2}

    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, 5)  # the bytes an old snapshot holds for that object
    pickler.dispatch_table = {
        Written: lambda w: (
            copyreg._reconstructor,
            (engine_module.RecentIds, object, None),
            (None, w.state),
        )
    }
    pickler.dump(Written())
    restored = pickle.loads(buffer.getvalue())
    assert not restored.first_time("a")
    assert restored.first_time("c")  # evicts "a"
    assert restored.first_time("a")
    again = pickle.loads(pickle.dumps(restored, 5))
    assert not again.first_time("a") and again.first_time("b")


# --- a ticker's state follows its partition (sharded engines, ADR 0014) --------------------


def at(engine: Engine, *points: tuple[int, float]) -> list[Notice]:
    """Ticks as (seconds after T0, price), the seconds as trade id."""
    out: list[Notice] = []
    for seconds, price in points:
        out += engine.on_tick(TICKER, f"{seconds}", T0 + seconds * S, price, 1.0, T0)
    return out


def test_a_tickers_windows_and_fire_count_follow_it_to_the_next_engine() -> None:
    from pipeline.live_state import PartitionState

    first = Engine()
    move = spec((PCT, 5.0, 60), trigger_id="p1", repeating=True)
    armed(first, move)
    # A 6 % move from 100 fires once; then the price falls back into the window.
    assert [n.fire_count for n in at(first, (0, 100.0), (10, 106.0), (20, 101.0))] == [1]
    saved = PartitionState("market.ticks", 0, 3, cep=first.ticker_states([TICKER, "OTHER"]))
    restored = PartitionState.decode(saved.encode(), "test")
    assert restored is not None and set(restored.cep) == {TICKER}

    second, empty = Engine(), Engine()
    for engine in (second, empty):
        armed(engine, move)
    second.restore_tickers(restored.cep)
    # 107 is 7 % above the window's low (100, at 0 s): the next owner fires the second
    # time; an engine without the window sees no move (and would count from 1).
    [again] = at(second, (30, 107.0))
    assert (again.kind, again.fire_count, again.values["ref_price"]) == (
        NoticeKind.FIRED,
        2,
        100.0,
    )
    assert at(empty, (30, 107.0)) == []
    [same] = at(first, (30, 107.0))  # the first engine, had it kept the ticker
    assert (same.fire_count, same.values) == (again.fire_count, again.values)
    assert at(second, (20, 150.0)) == []  # a trade id already seen there is a repeat


def test_a_candle_trigger_keeps_its_open_candle_and_a_sequence_its_first_edge() -> None:
    first, second = Engine(), Engine()
    candle = spec((ABOVE, 100.0), trigger_id="c1", period=60, repeating=True)
    sequence = spec((BELOW, 95.0), (ABOVE, 100.0), trigger_id="s1", within=600)
    for engine in (first, second):
        armed(engine, candle)
        armed(engine, sequence)
    at(first, (0, 99.0), (61, 96.0), (70, 94.0))  # candle 0 closed at 99; 94 crossed 95
    second.restore_tickers(first.ticker_states([TICKER]))
    # The open candle (96 then 94) closes at 101 > 100 on the next minute's tick, and
    # 101 completes the sequence begun on the first engine.
    notices = at(second, (80, 101.0), (125, 101.0))
    assert sorted((n.trigger_id, n.fire_count) for n in notices) == [("c1", 1), ("s1", 1)]


def test_forgetting_a_ticker_empties_its_windows_and_keeps_its_triggers() -> None:
    engine = Engine()
    armed(engine, spec((PCT, 5.0, 60), trigger_id="p1", repeating=True))
    at(engine, (0, 100.0))
    engine.forget_tickers(lambda ticker: ticker == TICKER)
    assert engine.ticker_states([TICKER]) == {} and "p1" in engine
    assert at(engine, (10, 110.0)) == []  # no window, no move
    assert [n.fire_count for n in at(engine, (20, 120.0))] == [1]
