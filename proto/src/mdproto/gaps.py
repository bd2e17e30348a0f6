"""What a ``market.gaps`` row says about the trades ``market.ticks`` must hold: the one
rule its readers share (the pipeline's gap rebuilds, the SDK's trade integrity report;
docs/protocol.md "The gaps table")."""

from __future__ import annotations


def counted_by_id(from_trade_id: str, to_trade_id: str, trades_recovered: int) -> bool:
    """How the repair counted ``trades_recovered`` (the ingestor's ``RepairPlan``): with
    consecutive numeric ids, the ids strictly between the ends (REPAIRED then has them
    all: to - from - 1 of them); otherwise every trade of [from_time, to_time] but the
    two ends, trades sharing an end's millisecond included."""
    first, last = from_trade_id, to_trade_id
    return first.isdigit() and last.isdigit() and int(last) - int(first) - 1 == trades_recovered
