"""Reference tick and volume bars in plain Python (docs/adr/0015): what the Spark job
(`pipeline.count_bars.bars_sql`) must produce from the same trades."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from mdproto import rules

Trade = tuple[int, str, float, float]  # (time ms, trade id, price, amount)


@dataclass(frozen=True)
class Bar:
    seq: int
    trade_ids: tuple[str, ...]
    open: float
    high: float
    low: float
    close: float
    volume: Decimal
    open_ms: int
    close_ms: int


def count_bars(trades: Iterable[Trade], bars: rules.Bars) -> list[Bar]:
    """Full bars of ``bars`` over ``trades`` (any order), counted in trade order."""
    ordered = sorted(trades, key=lambda t: (t[0], len(t[1]), t[1]))
    groups: dict[int, list[Trade]] = {}
    after: dict[int, Decimal] = {}
    total = Decimal(0)
    for n, trade in enumerate(ordered):
        seq = n // int(bars.size) if bars.kind == rules.TICKS else int(total // bars.size)
        total += Decimal(repr(trade[3]))
        groups.setdefault(seq, []).append(trade)
        after[seq] = total
    out = []
    for seq, group in sorted(groups.items()):
        full = (
            len(group) == int(bars.size)
            if bars.kind == rules.TICKS
            else after[seq] // bars.size > seq
        )
        if full:
            prices = [t[2] for t in group]
            out.append(
                Bar(
                    seq,
                    tuple(t[1] for t in group),
                    prices[0],
                    max(prices),
                    min(prices),
                    prices[-1],
                    sum((Decimal(repr(t[3])) for t in group), Decimal(0)),
                    group[0][0],
                    group[-1][0],
                )
            )
    return out
