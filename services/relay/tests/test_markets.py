"""Symbols checked against market metadata: the snapshot and its rules (pure), then a
relay reading the real compacted topic `market.markets` (stack)."""

from __future__ import annotations

import random
import statistics
import string
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import zmq

from mdproto import envelope, rules
from mdproto.messages import (
    CEPCondition,
    CEPTriggerAck,
    CEPTriggerRequest,
    FeedStatus,
    Market,
    OHLCRequest,
    Response,
    Status,
    SubmitHistoricalRequest,
    SubmitResponse,
)
from relay import client_requests as v
from relay import markets as markets_module
from relay.markets import KnownMarkets, MarketBook

if TYPE_CHECKING:
    from conftest import RelayFactory

NOW = 1_700_000_000_000
HOUR = 3_600_000
POLICY = v.Policy.of(["BINANCE", "KRAKEN"], max_candles=100_000, max_future_ms=60_000)


def market(ticker: str, active: bool = True, **fields: Any) -> Market:
    exchange, _, symbol = ticker.partition(":")
    base, _, quote = symbol.partition("/")
    return Market(ticker=ticker, exchange=exchange, base=base, quote=quote, active=active, **fields)


def known(*markets: Market) -> KnownMarkets:
    book = MarketBook()
    for m in markets:
        book.apply(m.ticker, m)
    return book.snapshot()


BINANCE = known(
    market("BINANCE:BTC/USDT"),
    market("BINANCE:ETH/USDT"),
    market("BINANCE:BTC/USDC"),
    market("BINANCE:LUNA/USDT", active=False),
)


# --- the snapshot (pure) -------------------------------------------------------------------


def test_listed_active_symbols_pass_and_unknown_exchanges_are_not_judged() -> None:
    assert BINANCE.check("BINANCE:BTC/USDT") is None
    assert BINANCE.check("KRAKEN:ANY/THING") is None  # no metadata for KRAKEN: accept
    assert KnownMarkets().check("BINANCE:NOPE/USDT") is None


def test_an_unlisted_symbol_is_refused_with_close_matches() -> None:
    why = BINANCE.check("BINANCE:BTC/USDX")
    assert why is not None
    assert "unknown symbol BTC/USDX: BINANCE lists no such market" in why
    assert "did you mean BTC/USDT, BTC/USDC" in why or "did you mean BTC/USDC, BTC/USDT" in why
    nothing_close = BINANCE.check("BINANCE:ZZZZZ/QQQ")
    assert nothing_close is not None and "did you mean" not in nothing_close


def test_an_inactive_symbol_keeps_its_history_but_is_refused_live_and_never_suggested() -> None:
    assert BINANCE.check("BINANCE:LUNA/USDT") is None  # delisted: past candles still exist
    why = BINANCE.check("BINANCE:LUNA/USDT", live=True)
    assert why is not None and "inactive" in why
    hint = BINANCE.check("BINANCE:LUNA/USDC")
    assert hint is not None and "LUNA/USDT" not in hint


def test_book_applies_records_tombstones_and_junk() -> None:
    book = MarketBook()
    assert book.apply_record(
        b"BINANCE:BTC/USDT", envelope.encode_record(market("BINANCE:BTC/USDT"))
    )
    assert book.apply_record(
        b"BINANCE:ETH/USDT", envelope.encode_record(market("BINANCE:ETH/USDT"))
    )
    first = book.snapshot()
    assert not book.changed
    assert book.apply_record(b"BINANCE:ETH/USDT", None)  # tombstone: delisted
    assert not book.apply_record(b"BINANCE:X/Y", b"\x01\x7fjunk")
    assert not book.apply_record(b"not a ticker", None)
    second = book.snapshot()
    assert first.check("BINANCE:ETH/USDT") is None  # an old snapshot never changes
    assert second.check("BINANCE:ETH/USDT") is not None
    assert second.counts() == {"BINANCE": (1, 1)}
    book.apply("BINANCE:BTC/USDT", None)
    assert book.snapshot().counts() == {}  # no markets left: the exchange is not judged


class _Record:
    def __init__(self, m: Market) -> None:
        self.m = m

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return self.m.ticker.encode()

    def value(self) -> bytes:
        return envelope.encode_record(self.m)


class _Polls:
    """A consumer whose polls return these batches, then nothing."""

    def __init__(self, *batches: list[Market]) -> None:
        self.batches = [[_Record(m) for m in b] for b in batches]

    def consume(self, num_messages: int, timeout: float) -> list[_Record]:
        return self.batches.pop(0) if self.batches else []


def test_markets_arriving_over_several_polls_make_one_snapshot() -> None:
    """One ingestor's markets land on several partitions and can arrive one poll apart
    (seen at platform start): a snapshot of the first poll alone refused BTC/USDT."""
    from relay.markets import MarketDirectory

    tickers = ["BYBIT:ETH/USDT", "BYBIT:BTC/USDT", "BYBIT:SOL/USDT"]
    polls = _Polls([market(tickers[0])], [market(t) for t in tickers[1:]])
    book = MarketBook()
    MarketDirectory("127.0.0.1:1", "market.markets")._drain(polls, book)
    assert all(book.snapshot().check(t) is None for t in tickers)


def test_validation_refuses_bad_symbols_last_for_every_request_kind() -> None:
    check = BINANCE.check
    ok = SubmitHistoricalRequest(
        request_id="r1", client_id="c1", ticker="BINANCE:BTC/USDT", period_seconds=60,
        start_time_ms=NOW - HOUR, end_time_ms=NOW,
    )  # fmt: skip
    assert v.check_submit(ok, POLICY, NOW, lambda: "x", symbols=check).work is not None
    bad = SubmitHistoricalRequest()
    bad.CopyFrom(ok)
    bad.ticker = "BINANCE:DOGE/USDT"
    outcome = v.check_submit(bad, POLICY, NOW, lambda: "x", symbols=check)
    assert outcome.work is None
    assert (outcome.reply.status, outcome.reply.error_code) == (Status.REJECTED, rules.BAD_SYMBOL)
    assert outcome.reply.request_id == "r1"
    bad.period_seconds = 0  # the existing rules come first
    assert v.check_submit(bad, POLICY, NOW, lambda: "x", symbols=check).reply.error_code == (
        rules.BAD_PERIOD
    )

    legacy = OHLCRequest(
        request_id="l1", ticker="BINANCE:NOPE/USDT", period_seconds=60,
        start_time_ms=NOW - HOUR, end_time_ms=NOW,
    )  # fmt: skip
    refused = v.check_legacy(legacy, POLICY, NOW, lambda: "x", symbols=check)
    assert isinstance(refused, v.Rejection) and refused.error_code == rules.BAD_SYMBOL
    legacy.ticker = "BINANCE:LUNA/USDT"  # inactive: its history is still served
    assert isinstance(v.check_legacy(legacy, POLICY, NOW, lambda: "x", symbols=check), v.Work)

    register = CEPTriggerRequest(
        trigger_id="t1", action=CEPTriggerRequest.REGISTER, ticker="BINANCE:NOPE/USDT",
        conditions=[CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=1.0)],
    )  # fmt: skip
    ack = v.check_trigger(register, POLICY, NOW, symbols=check).reply
    assert (ack.status, ack.error_code) == (Status.REJECTED, rules.BAD_SYMBOL)
    register.ticker = "BINANCE:LUNA/USDT"  # a trigger on a market that never trades
    ack = v.check_trigger(register, POLICY, NOW, symbols=check).reply
    assert (ack.error_code, "inactive" in ack.reason) == (rules.BAD_SYMBOL, True)
    cancel = CEPTriggerRequest(
        trigger_id="t1", action=CEPTriggerRequest.CANCEL, ticker="BINANCE:NOPE/USDT"
    )
    assert v.check_trigger(cancel, POLICY, NOW, symbols=check).accepted  # cancels always pass


def test_suggestions_for_a_large_exchange_are_memoised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal runs on the relay's loop: ~3,000 markets (Binance's size), 600 bases in
    five quote currencies; a typo repeated by a retrying client is looked up, not
    recomputed."""
    rng = random.Random(7)
    letters = string.ascii_uppercase
    bases = {"".join(rng.choices(letters, k=rng.randint(2, 6))) for _ in range(600)}
    big = known(
        *(market(f"BINANCE:{b}/{q}") for b in bases for q in ("USDT", "BTC", "ETH", "BNB", "EUR"))
    )
    typos = [f"BINANCE:{t}/USDT" for t in sorted({b[:-1] + "Q" for b in bases} - bases)[:50]]
    hints = [big.check(t) for t in typos]
    assert all(h is not None for h in hints)
    assert sum("did you mean" in (h or "") for h in hints) > 25
    calls: list[str] = []
    real = markets_module._close

    def counted(word: str, candidates: list[str]) -> list[str]:
        calls.append(word)
        return real(word, candidates)

    monkeypatch.setattr(markets_module, "_close", counted)
    assert big.check(typos[0]) == hints[0]
    assert calls == []  # memoised


# --- a relay on the real compacted topic -----------------------------------------------------


def _produce(bootstrap: str, topic: str, markets: list[Market]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for m in markets:
        producer.produce(topic, key=m.ticker.encode(), value=envelope.encode_record(m))
    assert producer.flush(30) == 0


def _submit(ticker: str, request_id: str) -> SubmitHistoricalRequest:
    now = int(time.time() * 1000)
    return SubmitHistoricalRequest(
        request_id=request_id, client_id="c1", ticker=ticker, period_seconds=60,
        start_time_ms=now - HOUR, end_time_ms=now - 60_000,
    )  # fmt: skip


@pytest.mark.stack
def test_relay_refuses_unlisted_symbols_in_milliseconds_once_markets_exist(
    local_stack: Any, make_relay: RelayFactory
) -> None:
    bootstrap = local_stack.endpoints.kafka_bootstrap
    tag = uuid.uuid4().hex[:8]
    topic = f"market.markets.{tag}"
    relay = make_relay(
        known_exchanges=["BINANCE", "KRAKEN"],
        kafka={
            "bootstrap_servers": bootstrap,
            "topic_cep_triggers": f"cep.triggers.{tag}",
            "topic_markets": topic,
        },
    )
    markets = relay.relay.markets
    assert markets is not None
    assert markets.wait_caught_up(60), "the relay never read the (empty) markets topic"
    relay.ingestor("BINANCE:")
    relay.ingestor("KRAKEN:")
    client = relay.client()

    # No metadata yet: accepted as before (the ingestor would report bad_symbol later).
    reply = relay.request(client, _submit("BINANCE:NOPE/USDT", "before"), SubmitResponse)
    assert reply.status == Status.OK

    _produce(bootstrap, topic, [
        market("BINANCE:BTC/USDT"), market("BINANCE:ETH/USDT"),
        market("BINANCE:LUNA/USDT", active=False),
    ])  # fmt: skip
    relay.wait_until(
        lambda: relay.sample("relay_known_markets", exchange="BINANCE", state="all") == 3,
        timeout=30,
        what="the relay to learn BINANCE's markets",
    )
    assert relay.sample("relay_known_markets", exchange="BINANCE", state="active") == 2

    latencies = []
    for i in range(50):
        started = time.perf_counter()
        reply = relay.request(client, _submit("BINANCE:ETH/USDC", f"bad-{i}"), SubmitResponse)
        latencies.append((time.perf_counter() - started) * 1000)
        assert (reply.status, reply.error_code) == (Status.REJECTED, rules.BAD_SYMBOL)
    assert "did you mean ETH/USDT" in reply.reason
    median, worst = statistics.median(latencies), max(latencies)
    print(f"bad_symbol refusal round trip: median {median:.2f} ms, max {worst:.2f} ms")
    assert median < 20, latencies  # "within milliseconds" (measured ~0.3 ms idle)

    assert relay.request(client, _submit("BINANCE:BTC/USDT", "good"), SubmitResponse).status == (
        Status.OK
    )
    assert relay.request(client, _submit("KRAKEN:ANY/THING", "kr"), SubmitResponse).status == (
        Status.OK  # KRAKEN has no metadata: not judged
    )
    legacy = OHLCRequest(
        request_id="legacy-nope", ticker="BINANCE:NOPE/USDT", period_seconds=60,
        start_time_ms=NOW - HOUR, end_time_ms=NOW,
    )  # fmt: skip
    refused = relay.request(client, legacy, Response)
    assert (refused.status, refused.error_code) == (Status.REJECTED, rules.BAD_SYMBOL)
    assert "unknown symbol NOPE/USDT" in refused.reason
    # An inactive market's history is still served ...
    assert relay.request(client, _submit("BINANCE:LUNA/USDT", "luna"), SubmitResponse).status == (
        Status.OK
    )
    # ... but a trigger on it would never fire.
    trigger = CEPTriggerRequest(
        trigger_id=f"t-{tag}", client_id="c1", action=CEPTriggerRequest.REGISTER,
        ticker="BINANCE:LUNA/USDT",
        conditions=[CEPCondition(kind=CEPCondition.PRICE_ABOVE, threshold=1.0)],
    )  # fmt: skip
    ack = relay.request(client, trigger, CEPTriggerAck)
    assert (ack.status, ack.error_code) == (Status.REJECTED, rules.BAD_SYMBOL)
    assert "inactive" in ack.reason
    # The live-path predicate (live=True by default).
    assert relay.relay.check_symbol("BINANCE:NOPE/USDT") is not None
    assert relay.relay.check_symbol("BINANCE:LUNA/USDT") is not None
    assert relay.relay.check_symbol("BINANCE:BTC/USDT") is None
    assert relay.sample("relay_rejections_total", type="submit", error_code="bad_symbol") == 50

    # A restarted relay knows the markets from the compacted topic before it answers.
    again = make_relay(
        kafka={"bootstrap_servers": bootstrap, "topic_cep_triggers": f"cep.triggers.{tag}",
               "topic_markets": topic},
    )  # fmt: skip
    assert again.relay.markets is not None and again.relay.markets.wait_caught_up(60)
    assert again.relay.check_symbol("BINANCE:ETH/USDC") is not None


def test_relay_without_kafka_checks_no_symbols(make_relay: RelayFactory) -> None:
    relay = make_relay()
    assert relay.relay.markets is None
    assert relay.relay.check_symbol("BINANCE:NOPE/USDT") is None
    client = relay.socket(zmq.REQ)
    relay.ingestor()
    reply = relay.request(client, _submit("BINANCE:NOPE/USDT", "r"), SubmitResponse)
    assert reply.status == Status.OK


@pytest.mark.stack
def test_a_live_subscription_to_an_unknown_symbol_fails_at_once(
    local_stack: Any, make_relay: RelayFactory
) -> None:
    bootstrap = local_stack.endpoints.kafka_bootstrap
    tag = uuid.uuid4().hex[:8]
    topic = f"market.markets.{tag}"
    _produce(bootstrap, topic, [market("BINANCE:BTC/USDT")])
    relay = make_relay(
        kafka={"bootstrap_servers": bootstrap, "topic_cep_triggers": f"cep.triggers.{tag}",
               "topic_markets": topic},
    )  # fmt: skip
    assert relay.relay.markets is not None and relay.relay.markets.wait_caught_up(60)
    relay.wait_until(
        lambda: relay.sample("relay_known_markets", exchange="BINANCE", state="all") == 1
    )
    relay.ingestor()
    sub = relay.subscriber("BINANCE:NOPE/USDT|status", "BINANCE:NOPE/USDT|tick")
    topic_frame, status = envelope.decode_sub(sub.recv_multipart())
    assert topic_frame == "BINANCE:NOPE/USDT|status"
    assert isinstance(status, FeedStatus)
    assert (status.state, status.error_code) == (FeedStatus.FAILED, rules.BAD_SYMBOL)
    assert "NOPE/USDT" in status.reason and not status.ingestor_id


@pytest.mark.stack
def test_a_failed_market_reader_starts_over_and_checks_nothing_meanwhile(local_stack: Any) -> None:
    """A reader that dies would leave the relay judging symbols on stale data forever
    (new listings refused bad_symbol until a restart): it starts over instead."""
    from confluent_kafka import Consumer

    from relay.markets import MarketDirectory

    bootstrap = local_stack.endpoints.kafka_bootstrap
    topic = f"market.markets.{uuid.uuid4().hex[:8]}"
    _produce(bootstrap, topic, [market("BINANCE:BTC/USDT")])
    consumers: list[Any] = []

    class FirstOneBreaks:
        """A real consumer; the first one fails once the topic is loaded."""

        def __init__(self, conf: dict[str, Any]) -> None:
            self._consumer = Consumer(conf)
            self._breaks = not consumers
            consumers.append(self)

        def consume(self, num_messages: int, timeout: float) -> list[Any]:
            if self._breaks:
                raise RuntimeError("broken record batch")
            return list(self._consumer.consume(num_messages=num_messages, timeout=timeout))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._consumer, name)

    directory = MarketDirectory(bootstrap, topic, consumer_factory=FirstOneBreaks).start()
    unlisted = "BINANCE:NOPE/USDT"
    try:
        assert directory.wait_caught_up(60)
        deadline = time.monotonic() + 30
        while directory.failure is None:
            assert time.monotonic() < deadline, "the failure never showed"
            time.sleep(0.02)
        assert directory.failure == "RuntimeError: broken record batch"
        assert directory.check(unlisted) is None  # unchecked, not judged on stale data
        while directory.failure is not None or directory.check(unlisted) is None:
            assert time.monotonic() < deadline, "the reader never started over"
            time.sleep(0.05)
        assert len(consumers) == 2 and directory.alive
        assert directory.check("BINANCE:BTC/USDT") is None  # read again from the start
    finally:
        directory.close()
