"""The paginated fetch loop and the Kafka write of one request, against fakes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ingestor.coverage import Span
from ingestor.exchange_calls import FetchEnv
from ingestor.history import run_history_job
from ingestor.model import ExchangeCallError, FaultKind
from ingestor.pages import iter_pages, plan_request
from ingestor.retry import RetryPolicy
from mdproto.messages import DataRequest, HistorySource, Status

MIN = 60_000
NOW = 100_000 * MIN


@pytest.fixture(autouse=True)
def _fakes(fakes: Any) -> None:
    global FakeExchange, FakeSink, make_candles
    FakeExchange, FakeSink, make_candles = fakes.FakeExchange, fakes.FakeSink, fakes.make_candles


def request(
    start: int, end: int, period: int = 60, ticker: str = "BINANCE:BTC/USDT"
) -> DataRequest:
    return DataRequest(
        request_id="r-1",
        kind=DataRequest.HISTORICAL,
        ticker=ticker,
        period_seconds=period,
        start_time_ms=start,
        end_time_ms=end,
    )


def env(sleeps: list[float] | None = None, concurrency: int = 1, **policy: float) -> FetchEnv:
    async def sleep(delay: float) -> None:
        if sleeps is not None:
            sleeps.append(delay)

    return FetchEnv(
        policy=RetryPolicy(**policy),  # type: ignore[arg-type]
        page_limit=1000,
        page_concurrency=concurrency,
        now_ms=lambda: NOW,
        sleep=sleep,
        rand=lambda: 0.5,
    )


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def job(
    exchange: FakeExchange, sink: FakeSink, req: DataRequest, fetch_env: FetchEnv, batch: int = 500
):  # type: ignore[no-untyped-def]
    return run(
        run_history_job(req, exchange, sink, ingestor_id="ing", batch_size=batch, env=fetch_env)
    )


def test_own_pagination_fetches_far_more_than_ten_pages() -> None:
    exchange = FakeExchange(make_candles(range(0, 12_345 * MIN, MIN)))
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 12_345 * MIN), env())
    assert outcome.status == Status.OK and outcome.rows == 12_345
    assert len(exchange.calls) == 13  # ccxt's paginate would have stopped at 10
    assert [c[0] for c in exchange.calls[:3]] == [0, 1000 * MIN, 2000 * MIN]
    rows = [r.open_time_ms for _, b in sink.batches for r in b.rows]
    assert rows == list(range(0, 12_345 * MIN, MIN))


def test_short_pages_from_the_exchange_still_paginate() -> None:
    exchange = FakeExchange(make_candles(range(0, 1000 * MIN, MIN)), page_cap=300)
    outcome = job(exchange, FakeSink(), request(0, 1000 * MIN), env())
    assert outcome.rows == 1000 and len(exchange.calls) == 4


def test_records_are_keyed_by_ticker_and_end_with_the_final_marker() -> None:
    exchange = FakeExchange(make_candles(range(0, 1200 * MIN, MIN)))
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 1200 * MIN), env(), batch=500)
    assert {key for key, _ in sink.batches} == {"BINANCE:BTC/USDT"}
    assert [b.sequence for _, b in sink.batches] == [0, 1, 2, 3]
    final = sink.batches[-1][1]
    assert (
        final.is_final and final.metadata.total_batches == 3 and final.metadata.total_rows == 1200
    )
    assert outcome.batches == 3 and outcome.delivered


def test_missing_candles_are_expected_gaps_not_errors() -> None:
    opens = [t * MIN for t in range(100) if t % 10 != 3]  # 10 minutes without trades
    exchange = FakeExchange(make_candles(opens))
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 100 * MIN), env())
    assert (outcome.status, outcome.rows, outcome.expected_gaps) == (Status.OK, 90, 10)
    final = sink.batches[-1][1].metadata
    assert (final.expected_candles, final.total_rows, final.expected_gaps) == (100, 90, 10)


def test_still_open_candle_is_dropped() -> None:
    exchange = FakeExchange(make_candles(range((NOW - 10 * MIN), NOW + MIN, MIN)))
    sink = FakeSink()
    outcome = job(exchange, sink, request(NOW - 10 * MIN, NOW + 60 * MIN), env())
    rows = [r.open_time_ms for _, b in sink.batches for r in b.rows]
    assert rows[-1] == NOW - MIN  # closed exactly at now; the one opening at now is open
    assert outcome.rows == 10 and outcome.expected_gaps == 0
    assert exchange.calls[0][1] == NOW - MIN  # no page requested past the open candle


def test_no_candles_is_not_found() -> None:
    sink = FakeSink()
    outcome = job(FakeExchange([]), sink, request(0, 10 * MIN), env())
    assert outcome.status == Status.NOT_FOUND and outcome.expected_gaps == 10
    assert len(sink.batches) == 1 and sink.batches[0][1].metadata.status == Status.NOT_FOUND


def test_transient_faults_are_retried_with_backoff_and_retry_after() -> None:
    faults = [
        ExchangeCallError(FaultKind.RATE_LIMITED, "429", retry_after_s=3.0),
        ExchangeCallError(FaultKind.UNAVAILABLE, "503"),
        ExchangeCallError(FaultKind.TIMEOUT, "slow"),
    ]
    exchange = FakeExchange(make_candles(range(0, 50 * MIN, MIN)), faults=faults)
    sleeps: list[float] = []
    outcome = job(
        exchange, FakeSink(), request(0, 50 * MIN), env(sleeps, base_delay_s=0.5, jitter=0)
    )
    assert outcome.status == Status.OK and outcome.rows == 50
    assert sleeps == [3.0, 1.0, 2.0]  # Retry-After, then the backoff of attempts 2 and 3


def test_persistent_transient_fault_gives_up_with_its_code() -> None:
    faults = [ExchangeCallError(FaultKind.UNAVAILABLE, "503 down")] * 3
    exchange = FakeExchange(make_candles(range(0, 5 * MIN, MIN)), faults=faults)
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 5 * MIN), env(max_attempts=3))
    assert outcome.status == Status.ERROR and outcome.error_code == "exchange_unavailable"
    assert "503 down" in outcome.reason
    assert len(exchange.calls) == 3


def test_bad_symbol_fails_fast_with_the_exchange_reason() -> None:
    faults = [
        ExchangeCallError(FaultKind.BAD_SYMBOL, 'binance {"code":-1121,"msg":"Invalid symbol."}')
    ]
    exchange = FakeExchange([], faults=faults)
    sink = FakeSink()
    sleeps: list[float] = []
    outcome = job(exchange, sink, request(0, 5 * MIN), env(sleeps))
    assert (outcome.status, outcome.error_code) == (Status.ERROR, "bad_symbol")
    assert "Invalid symbol." in outcome.reason
    assert sleeps == [] and len(exchange.calls) == 1
    ((_key, marker),) = sink.batches
    assert marker.is_final and marker.metadata.reason == outcome.reason


def test_failure_mid_way_writes_error_marker_after_the_rows() -> None:
    exchange = FakeExchange(make_candles(range(0, 3000 * MIN, MIN)))
    exchange.faults = []
    original = exchange.fetch_candles

    async def flaky(symbol: str, tf: str, since: int, until: int, limit: int):  # type: ignore[no-untyped-def]
        if since >= 2000 * MIN:
            raise ExchangeCallError(FaultKind.BAD_REQUEST, "nope")
        return await original(symbol, tf, since, until, limit)

    exchange.fetch_candles = flaky  # type: ignore[method-assign]
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 3000 * MIN), env(), batch=1000)
    assert outcome.status == Status.ERROR and outcome.rows == 2000
    assert [b.sequence for _, b in sink.batches] == [0, 1, 2]
    assert sink.batches[-1][1].metadata.total_batches == 2
    # The integrity report's denominator is there for a failed fetch too: 1000 missing.
    assert sink.batches[-1][1].metadata.expected_candles == 3000


def test_unsupported_period_and_bad_requests_become_error_markers() -> None:
    cases = [
        (request(0, 10 * MIN, period=7), "unsupported_period"),
        (request(10 * MIN, 0), "invalid_request"),
        (request(0, 10 * MIN, period=0), "invalid_request"),
        (request(0, 10 * MIN, ticker="binance:btc"), "invalid_request"),
    ]
    for req, code in cases:
        sink = FakeSink()
        outcome = job(FakeExchange([]), sink, req, env())
        assert (outcome.status, outcome.error_code) == (Status.ERROR, code), req
        assert sink.batches[-1][1].is_final


def test_a_period_the_exchange_lacks_is_left_to_the_bars_from_trades() -> None:
    """With bars from trades on, an unserved period is one OK final marker of source
    SOURCE_TRADES (the pipeline builds the bars); bad requests still fail as before."""
    exchange = FakeExchange(make_candles(range(0, 10 * MIN, MIN)))
    sink = FakeSink()
    req = request(0, 10 * MIN, period=7)
    outcome = run(
        run_history_job(
            req, exchange, sink, ingestor_id="ing", batch_size=9, env=env(), from_trades=True
        )
    )
    assert (outcome.status, outcome.rows, outcome.batches) == (Status.OK, 0, 0)
    ((key, marker),) = sink.batches
    meta = marker.metadata
    assert key == req.ticker and marker.is_final and marker.sequence == 0
    assert meta.source == HistorySource.SOURCE_TRADES and meta.total_rows == 0
    assert "bars from recorded trades" in meta.reason and "period 7 s" in meta.reason
    assert exchange.calls == []  # the exchange is not asked
    bad = request(0, 10 * MIN, period=0)
    outcome = run(
        run_history_job(
            bad, exchange, FakeSink(), ingestor_id="ing", batch_size=9, env=env(), from_trades=True
        )
    )
    assert (outcome.status, outcome.error_code) == (Status.ERROR, "invalid_request")


def test_tick_and_volume_bars_are_one_trades_marker_carrying_the_bars() -> None:
    """A tick or volume bar request never asks the exchange: one OK SOURCE_TRADES marker
    naming the bars; bad bars or bars with bars_from_trades off are ERROR markers."""
    exchange = FakeExchange(make_candles(range(0, 10 * MIN, MIN)))
    sink = FakeSink()
    req = request(0, 10 * MIN, period=0)
    req.bars = "100ticks"
    outcome = run(
        run_history_job(
            req, exchange, sink, ingestor_id="ing", batch_size=9, env=env(), from_trades=True
        )
    )
    assert (outcome.status, outcome.rows) == (Status.OK, 0)
    ((_, marker),) = sink.batches
    assert marker.metadata.source == HistorySource.SOURCE_TRADES
    assert marker.metadata.bars == "100ticks" and exchange.calls == []
    for bars, on, code in (
        ("0vol", True, "invalid_request"),
        ("5vol", False, "unsupported_period"),
    ):
        bad = request(0, 10 * MIN, period=0)
        bad.bars = bars
        outcome = run(
            run_history_job(
                bad,
                exchange,
                FakeSink(),
                ingestor_id="ing",
                batch_size=9,
                env=env(),
                from_trades=on,
            )
        )
        assert (outcome.status, outcome.error_code) == (Status.ERROR, code), bars


def test_a_ticker_no_exchange_here_serves_is_an_invalid_request_asking_nobody() -> None:
    """No exchange of this ingestor has the ticker's prefix (a misrouted or malformed
    request): an ERROR marker, and no other exchange asked in its stead."""
    reasons = {}
    for ticker in ("KRAKEN:BTC/USD", "binance:btc"):
        sink = FakeSink()
        req = request(0, 10 * MIN, ticker=ticker)
        outcome = run(run_history_job(req, None, sink, ingestor_id="i", batch_size=9, env=env()))
        assert (outcome.status, outcome.error_code) == (Status.ERROR, "invalid_request")
        assert outcome.delivered and sink.batches[-1][1].metadata.reason == outcome.reason
        reasons[ticker] = outcome.reason
    assert "serves no exchange with the prefix KRAKEN" in reasons["KRAKEN:BTC/USD"]
    assert "serves no exchange" not in reasons["binance:btc"]  # the ticker rule's own reason


def test_delivery_failure_turns_the_marker_into_an_error() -> None:
    exchange = FakeExchange(make_candles(range(0, 1500 * MIN, MIN)))
    sink = FakeSink(fail_sequences={1})
    outcome = job(exchange, sink, request(0, 1500 * MIN), env(), batch=500)
    assert (outcome.status, outcome.error_code) == (Status.ERROR, "kafka_delivery")
    assert sink.batches[-1][1].metadata.status == Status.ERROR


def test_undelivered_final_marker_is_followed_by_an_error_marker_attempt() -> None:
    exchange = FakeExchange(make_candles(range(0, 10 * MIN, MIN)))
    sink = FakeSink(fail_finals=1)
    outcome = job(exchange, sink, request(0, 10 * MIN), env())
    assert outcome.error_code == "kafka_delivery" and outcome.delivered
    assert sink.batches[-1][1].metadata.status == Status.ERROR


def test_plan_request_maps_ticker_to_symbol() -> None:
    symbol, plan = plan_request(request(0, 10 * MIN, period=3600), FakeExchange([]), env())
    assert symbol == "BTC/USDT" and plan.timeframe == "1h"


def test_iter_pages_yields_nothing_for_an_empty_plan() -> None:
    async def collect() -> list[object]:
        _, plan = plan_request(request(NOW, NOW + MIN), FakeExchange([]), env())
        return [p async for p in iter_pages(FakeExchange([]), "BTC/USDT", plan, env())]

    assert run(collect()) == []


class Stored:
    """A CoverageSource holding fixed spans (the Iceberg reader has its own stack test)."""

    def __init__(self, *spans: Span) -> None:
        self.spans = list(spans)
        self.asked: list[tuple[str, int]] = []

    async def stored(self, ticker: str, period_seconds: int) -> list[Span]:
        self.asked.append((ticker, period_seconds))
        return self.spans


def stored_job(exchange: FakeExchange, sink: FakeSink, req: DataRequest, stored: Stored):  # type: ignore[no-untyped-def]
    return run(
        run_history_job(
            req, exchange, sink, ingestor_id="ing", batch_size=500, env=env(), stored=stored
        )
    )


def test_a_stored_range_is_answered_without_asking_the_exchange() -> None:
    exchange = FakeExchange(make_candles(range(0, 100 * MIN, MIN)))
    sink = FakeSink()
    stored = Stored(Span(0, 100 * MIN))
    outcome = stored_job(exchange, sink, request(10 * MIN, 90 * MIN), stored)
    assert exchange.calls == [] and stored.asked == [("BINANCE:BTC/USDT", 60)]
    ((_key, marker),) = sink.batches
    meta = marker.metadata
    assert (outcome.status, meta.total_rows, meta.source) == (
        Status.OK,
        0,
        HistorySource.SOURCE_STORAGE,
    )
    assert meta.expected_candles == 80


def test_only_the_gaps_between_stored_spans_are_fetched() -> None:
    exchange = FakeExchange(make_candles(range(0, 100 * MIN, MIN)))
    sink = FakeSink()
    stored = Stored(Span(0, 40 * MIN), Span(60 * MIN, 100 * MIN))
    outcome = stored_job(exchange, sink, request(0, 100 * MIN), stored)
    rows = [r.open_time_ms for _, b in sink.batches for r in b.rows]
    assert rows == list(range(40 * MIN, 60 * MIN, MIN))
    assert [c[0] for c in exchange.calls] == [40 * MIN]
    final = sink.batches[-1][1].metadata
    assert final.source == HistorySource.SOURCE_STORAGE_AND_EXCHANGE
    assert (outcome.rows, final.expected_candles, final.expected_gaps) == (20, 100, 0)


def test_refetch_ignores_what_is_stored() -> None:
    exchange = FakeExchange(make_candles(range(0, 100 * MIN, MIN)))
    sink = FakeSink()
    stored = Stored(Span(0, 100 * MIN))
    req = request(0, 100 * MIN)
    req.refetch = True
    outcome = stored_job(exchange, sink, req, stored)
    assert outcome.rows == 100 and stored.asked == []
    assert sink.batches[-1][1].metadata.source == HistorySource.SOURCE_EXCHANGE


class SlowExchange:
    """Answers each page after yielding to the loop, and records the most calls in flight."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.in_flight = 0
        self.most_in_flight = 0

    def timeframes(self) -> list[str]:
        return list(self.inner.timeframes())

    async def fetch_candles(self, symbol: str, tf: str, since: int, until: int, limit: int):  # type: ignore[no-untyped-def]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            return await self.inner.fetch_candles(symbol, tf, since, until, limit)
        finally:
            self.in_flight -= 1


def test_concurrent_pages_write_the_same_records_as_one_by_one() -> None:
    opens = [t * MIN for t in range(12_345) if t % 997 != 5]  # gaps in several windows
    written = []
    for concurrency in (1, 4):
        exchange = SlowExchange(FakeExchange(make_candles(opens), page_cap=700))
        sink = FakeSink()
        outcome = job(exchange, sink, request(0, 12_345 * MIN), env(concurrency=concurrency))  # type: ignore[arg-type]
        assert outcome.status == Status.OK and outcome.rows == len(opens)
        assert exchange.most_in_flight == concurrency
        written.append([[r.open_time_ms for r in b.rows] for _, b in sink.batches])
        final = sink.batches[-1][1].metadata
        assert (final.expected_candles, final.expected_gaps) == (12_345, 12_345 - len(opens))
    assert written[0] == written[1]  # same rows, same records, same order


def test_a_failed_window_stops_the_request_after_the_windows_before_it() -> None:
    exchange = SlowExchange(FakeExchange(make_candles(range(0, 6000 * MIN, MIN))))
    original = exchange.inner.fetch_candles

    async def flaky(symbol: str, tf: str, since: int, until: int, limit: int):  # type: ignore[no-untyped-def]
        if 2000 * MIN <= since < 3000 * MIN:
            raise ExchangeCallError(FaultKind.BAD_REQUEST, "nope")
        return await original(symbol, tf, since, until, limit)

    exchange.inner.fetch_candles = flaky
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 6000 * MIN), env(concurrency=3), batch=1000)  # type: ignore[arg-type]
    assert outcome.status == Status.ERROR and outcome.rows == 2000
    rows = [r.open_time_ms for _, b in sink.batches for r in b.rows]
    assert rows == list(range(0, 2000 * MIN, MIN))  # later windows fetched are not written
    assert sink.batches[-1][1].metadata.expected_candles == 6000


@pytest.mark.parametrize("fault", ["dropped", "failed"])
def test_a_window_the_exchange_did_not_answer_is_missing_not_exchange_gaps(fault: str) -> None:
    """Window 1000..1999 comes back empty (OK) or fails (ERROR): either way the final
    marker leaves its 1,000 slots to `missing = expected - rows - gaps`; the quiet
    minutes of the windows answered are exchange gaps."""
    opens = [t * MIN for t in range(3000) if t % 3]  # a third of the minutes without trades
    exchange = SlowExchange(FakeExchange(make_candles(opens)))
    original = exchange.inner.fetch_candles

    async def unanswered(symbol: str, tf: str, since: int, until: int, limit: int):  # type: ignore[no-untyped-def]
        if not 1000 * MIN <= since < 2000 * MIN:
            return await original(symbol, tf, since, until, limit)
        if fault == "failed":
            raise ExchangeCallError(FaultKind.BAD_REQUEST, "nope")
        return []

    exchange.inner.fetch_candles = unanswered
    sink = FakeSink()
    outcome = job(exchange, sink, request(0, 3000 * MIN), env(concurrency=3), batch=333)  # type: ignore[arg-type]
    meta = sink.batches[-1][1].metadata
    written = [r.open_time_ms for _, b in sink.batches for r in b.rows]
    answered = [t for t in opens if not 1000 * MIN <= t < 2000 * MIN]
    if fault == "failed":  # the windows after a failure are not written
        answered = [t for t in answered if t < 1000 * MIN]
    assert written == answered and meta.expected_candles == 3000
    status, gaps = (Status.OK, 334 + 333) if fault == "dropped" else (Status.ERROR, 334)
    assert (outcome.status, meta.total_rows, meta.expected_gaps) == (status, len(answered), gaps)
    missing = 1000 if fault == "dropped" else 2000  # failed: the last window was never written
    assert meta.expected_candles - meta.total_rows - meta.expected_gaps == missing


def test_the_claim_is_decided_while_the_first_pages_are_fetched() -> None:
    exchange = FakeExchange(make_candles(range(0, 3000 * MIN, MIN)))

    async def scenario(won: bool) -> tuple[Any, FakeSink, int]:
        sink = FakeSink()
        verdict: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        calls_at_verdict = -1

        asked = asyncio.Event()
        original = exchange.fetch_candles

        async def fetch(symbol: str, tf: str, since: int, until: int, limit: int):  # type: ignore[no-untyped-def]
            asked.set()
            return await original(symbol, tf, since, until, limit)

        exchange.fetch_candles = fetch

        async def decide() -> None:
            nonlocal calls_at_verdict
            await asked.wait()  # the claim takes longer than the first page
            await asyncio.sleep(0)
            calls_at_verdict = len(exchange.calls)
            assert sink.batches == []  # nothing written before the verdict
            verdict.set_result(won)

        decider = asyncio.create_task(decide())
        outcome = await run_history_job(
            request(0, 3000 * MIN),
            exchange,
            sink,
            ingestor_id="ing",
            batch_size=500,
            env=env(concurrency=4),
            claim=verdict,
        )
        await decider
        return outcome, sink, calls_at_verdict

    outcome, sink, overlapped = run(scenario(won=True))
    assert outcome.claimed and outcome.status == Status.OK and outcome.rows == 3000
    assert overlapped >= 1  # the exchange was already asked when the verdict came
    exchange = FakeExchange(make_candles(range(0, 3000 * MIN, MIN)))
    outcome, sink, _ = run(scenario(won=False))
    assert not outcome.claimed and not outcome.delivered
    assert sink.batches == []  # the winner writes the request, this ingestor nothing
    assert len(exchange.calls) == 1  # only the first page was asked for before the verdict


def test_a_lost_claim_writes_no_error_marker_either() -> None:
    async def scenario() -> tuple[Any, FakeSink]:
        sink = FakeSink()
        verdict: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        verdict.set_result(False)
        outcome = await run_history_job(
            request(10 * MIN, 0),  # invalid: would be an ERROR marker if this ingestor held it
            FakeExchange([]),
            sink,
            ingestor_id="ing",
            batch_size=500,
            env=env(),
            claim=verdict,
        )
        return outcome, sink

    outcome, sink = run(scenario())
    assert not outcome.claimed and sink.batches == []
