"""Gap repair: pages the exchange's trade history over a recorded market's gap and
writes the missing trades to Kafka (`Tick.repaired`), where they land in
`market.ticks` once, by (ticker, trade_id), like every trade.

Steps of one repair, in order (the TradeGap records say where it stands):
  1. REPAIRING is written;
  2. pages are fetched (ingestor.recording.RepairPlan says which) through
     `call_with_retry`, so the exchange's rate limit, its retries and the health
     that drives the relay's breaker are those of every other call;
  3. each page's trades inside the gap are sent; the last one's delivery is
     awaited (one key, one partition, an idempotent producer: it vouches for the
     ones before);
  4. REPAIRED, or UNREPAIRABLE with the reason, is written.
A transient failure (the exchange down, Kafka not taking records) leaves the gap
OPEN with its reason; the recorder retries it later. Repairs run beside the live
feeds and never wait for them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ingestor.clock import wall_clock_ms
from ingestor.errors import RequestFailedError
from ingestor.exchange_calls import FetchEnv, call_with_retry
from ingestor.kafka_sink import DeliveryError
from ingestor.live import GapFound, TickSink, tick_record
from ingestor.model import FaultKind, Trade
from ingestor.recording import RepairPlan
from ingestor.venues.base import Venue
from mdproto.messages import Tick, TradeGap
from mdproto.topics import parse_ticker

log = logging.getLogger(__name__)

_TRANSIENT = frozenset(k.value for k in FaultKind if k.transient)


class TradeHistory(Protocol):
    """What the repairer needs of an exchange (ingestor.exchanges.ExchangeAdapter)."""

    venue: Venue
    consecutive_trade_ids: bool

    async def fetch_trades(
        self, symbol: str, limit: int, *, since_ms: int | None = None, cursor: str | None = None
    ) -> list[Trade]: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    state: int  # TradeGap.State: REPAIRED, UNREPAIRABLE, or OPEN (retry later)
    reason: str
    recovered: int


async def repair_gap(
    gap: GapFound,
    exchange: TradeHistory,
    sink: TickSink,
    env: FetchEnv,
    *,
    page_limit: int,
    max_pages: int,
    progress: Callable[[int, str], Awaitable[None]],
    now_ms: Callable[[], int] = wall_clock_ms,
) -> Outcome:
    """Steps 2-3 of a repair; `progress(state, reason)` writes the gap's state (step 1)."""
    venue = exchange.venue
    limit = min(page_limit, venue.trade_page_cap)
    plan = RepairPlan(gap, venue.trade_paging, exchange.consecutive_trade_ids, limit)
    if plan.finished:
        return Outcome(TradeGap.REPAIRED, "no trade was missing", 0)
    await progress(TradeGap.REPAIRING, f"paging {venue.exchange_id} {venue.trade_paging.value}")
    symbol = parse_ticker(gap.ticker).symbol
    pages = sent = 0
    try:
        while not plan.finished:
            if pages >= max_pages:
                return Outcome(
                    TradeGap.OPEN, f"stopped after {pages} pages ({sent} trades); resumes", sent
                )
            cursor, since_ms = plan.request()
            page = await call_with_retry(
                functools.partial(
                    exchange.fetch_trades, symbol, limit, since_ms=since_ms, cursor=cursor
                ),
                env,
                f"trades of {gap.ticker} (gap repair)",
            )
            pages += 1
            sent += await _send(gap.ticker, plan.take(page), sink, now_ms())
    except RequestFailedError as exc:
        if exc.error_code in _TRANSIENT:
            return Outcome(TradeGap.OPEN, f"{exc.reason}; retrying later", sent)
        return Outcome(
            TradeGap.UNREPAIRABLE,
            f"{venue.exchange_id} refused its trade history: {exc.reason}",
            sent,
        )
    except DeliveryError as exc:
        return Outcome(
            TradeGap.OPEN, f"Kafka did not take the trades ({exc}); retrying later", sent
        )
    state, reason = plan.verdict(venue.exchange_id)
    log.info("gap %s -> %s: %s", _describe(gap), TradeGap.State.Name(state), reason)
    return Outcome(state, reason, len(plan.recovered))


async def _send(ticker: str, trades: list[Trade], sink: TickSink, ingested_ms: int) -> int:
    if not trades:
        return 0
    for trade in trades[:-1]:
        await sink.send_tick(ticker, _repaired(ticker, trade, ingested_ms))
    delivery = await sink.send_tick_tracked(ticker, _repaired(ticker, trades[-1], ingested_ms))
    await delivery  # raises DeliveryError
    return len(trades)


def _repaired(ticker: str, trade: Trade, ingested_ms: int) -> Tick:
    record = tick_record(ticker, trade, ingested_ms)
    record.repaired = True
    return record


def _describe(gap: GapFound) -> str:
    return f"{gap.ticker} {gap.before.trade_id}..{gap.after.trade_id}"
