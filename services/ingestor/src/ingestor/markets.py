"""Market metadata -> `Market` records for `market.markets`.

`market_records` (pure) makes the records; `MarketPublisher` loads each
exchange's markets and writes them, at start, on CONFIG_UPDATE and every
`market_metadata.refresh_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from google.protobuf.message import Message

from ingestor.clock import wall_clock_ms
from ingestor.errors import RequestFailedError
from ingestor.exchange_calls import FetchEnv, call_with_retry
from ingestor.model import MarketInfo
from ingestor.stats import IngestorStats
from mdproto import ProtocolError
from mdproto.messages import Market
from mdproto.topics import parse_ticker

if TYPE_CHECKING:
    from ingestor.exchanges import ExchangeAdapter

log = logging.getLogger(__name__)


def market_records(
    exchange_prefix: str,
    infos: Iterable[MarketInfo],
    wanted: Iterable[str],
    updated_at_ms: int,
) -> list[Market]:
    """Records for the served markets; `wanted` (BASE/QUOTE) empty means all.

    Markets whose unified symbol does not make a platform ticker
    (`EXCHANGE:BASE/QUOTE`, upper case alphanumerics) are skipped.
    """
    only = {w.upper() for w in wanted}
    records = []
    for info in infos:
        if only and info.symbol.upper() not in only:
            continue
        try:
            ticker = str(parse_ticker(f"{exchange_prefix}:{info.symbol}"))
        except ProtocolError:
            log.debug("market %s has no platform ticker; skipped", info.symbol)
            continue
        records.append(
            Market(
                ticker=ticker,
                exchange=exchange_prefix,
                symbol=info.exchange_symbol,
                base=info.base,
                quote=info.quote,
                active=info.active,
                price_precision=info.price_precision,
                amount_precision=info.amount_precision,
                min_amount=info.min_amount,
                max_amount=info.max_amount,
                min_price=info.min_price,
                max_price=info.max_price,
                min_cost=info.min_cost,
                updated_at_ms=updated_at_ms,
            )
        )
    return records


class MarketSink(Protocol):
    async def send_market(self, key: str, record: Message) -> Awaitable[object]:
        """Queue a record; the returned awaitable completes on delivery or raises."""
        ...


class MarketPublisher:
    """Loads every served exchange's markets and writes a Market record per served market.

    `ready` is set once the first round was written (or failed): an unreachable
    exchange must not keep the rest of the ingestor waiting, so that round runs
    in the background.
    """

    def __init__(
        self,
        exchanges: Sequence[ExchangeAdapter],
        sink: MarketSink,
        env_for: Callable[[ExchangeAdapter], FetchEnv],
        stats: IngestorStats,
        ready: asyncio.Event,
    ) -> None:
        self._exchanges = exchanges
        self._sink = sink
        self._env_for = env_for
        self._stats = stats
        self.ready = ready

    async def publish(self, reload: bool) -> int:
        """Load markets and write a Market record per served market; how many."""
        total = 0
        for adapter in self._exchanges:
            try:
                await call_with_retry(
                    lambda a=adapter: a.load_markets(reload),  # type: ignore[misc]
                    self._env_for(adapter),
                    f"{adapter.exchange_id} load_markets",
                )
            except RequestFailedError as exc:
                log.error("markets of %s not loaded: %s", adapter.exchange_id, exc)
                continue
            records = market_records(
                adapter.prefix, adapter.markets(), adapter.settings.markets, wall_clock_ms()
            )
            deliveries = [await self._sink.send_market(r.ticker, r) for r in records]
            results = await asyncio.gather(*deliveries, return_exceptions=True)
            failed = sum(isinstance(r, BaseException) for r in results)
            if failed:
                log.error("%d of %d Market records not delivered", failed, len(records))
            total += len(records) - failed
            log.info("published %d markets of %s", len(records) - failed, adapter.exchange_id)
        self._stats.markets_published += total
        return total

    async def first(self) -> None:
        await self.publish(reload=False)
        self.ready.set()

    async def refresh_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.publish(reload=True)
