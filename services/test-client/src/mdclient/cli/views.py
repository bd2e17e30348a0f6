"""Terminal views of the streaming commands: the spinner of a history wait, the order
book ladder redrawn in place, and one line per live message. Data goes to stdout;
progress and events to stderr, so a pipe gets data only."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from mdclient import timeparse
from mdproto.markets import Precision, price_difference
from mdproto.messages import OHLC, BookSnapshot, TakerSide, Tick

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.history import ProgressEvent
    from mdclient.live import LiveMessage
    from mdclient.replay import ReplayMessage
    from mdclient.streams import QueueStream
    from mdproto.book import Level

T = TypeVar("T")
#: Prices and amounts without market metadata: each in its shortest exact form.
_AS_THEY_COME = Precision()


def until(
    stream: QueueStream[T],
    count: int | None,
    duration: float | None,
    *,
    ended: Callable[[], bool] | None = None,
) -> Iterator[T]:
    """The stream's messages, `count` at most, for `duration` seconds (None: no limit),
    or until `ended()` says no more will come; a stream ended by an error (FAILED,
    REFUSED: its reason went to stderr) raises it."""
    deadline = time.monotonic() + duration if duration else None
    taken = 0
    while count is None or taken < count:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return
        message = stream.get(timeout_s=remaining)
        if message is None:
            if stream.error is not None:
                raise stream.error
            if ended is not None and ended():
                return
            continue
        taken += 1
        yield message


class Progress:
    """Spinner with elapsed time and attempt on stderr (silent when not a terminal)."""

    def __init__(self, console: Console, what: str, *, quiet: bool) -> None:
        self._console = console
        self._what = what
        self._enabled = not quiet
        self._status: Any = None

    def __enter__(self) -> Progress:
        if self._enabled:
            self._status = self._console.status(f"connecting for {self._what}")
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def note(self, text: str) -> None:
        if self._status is not None:
            self._status.update(f"{text}: {self._what}")

    def update(self, event: ProgressEvent) -> None:
        if self._status is None:
            return
        attempt = f"attempt {event.attempt}/{event.attempts}"
        text = {
            "subscribing": "subscribing",
            "submitting": "submitting",
            "waiting": "waiting for the pipeline",
            "retrying": "no answer, retrying",
            "reading": "reading Iceberg",
            "done": "done",
        }[event.phase]
        self._status.update(
            f"{text} {self._what} - {event.elapsed_s:.1f}s, {attempt}", spinner="dots"
        )


def live_line(message: LiveMessage) -> str:
    """One terminal line per live message."""
    if isinstance(message, OHLC):
        # A correction re-publishes a closed candle a late trade changed (docs/protocol.md).
        state = "fixed " if message.correction else "closed" if message.closed else "open  "
        trades = message.trade_count if message.HasField("trade_count") else ""
        return (
            f"{timeparse.format_ms(message.open_time_ms)}  {message.ticker}  "
            f"ohlc:{timeparse.format_period(message.period_seconds):>3} {state}  "
            f"O {message.open:g}  H {message.high:g}  L {message.low:g}  C {message.close:g}  "
            f"V {message.volume:g}  n {trades}"
            + ("  incomplete" if message.incomplete else "")  # trades lost to a feed gap
        )
    side = TakerSide.Name(message.side).replace("SIDE_UNSPECIFIED", "-")
    return (
        f"{timeparse.format_ms(message.timestamp_ms)}  {message.ticker}  tick  {side:<4}  "
        f"{message.price:g} x {message.amount:g}  #{message.trade_id}"
    )


def replay_line(topic: str, message: ReplayMessage) -> str:
    """One terminal line per replayed message: a live line, or a book change's kind,
    exchange sequence and the levels it sets (the topic's sequence on every line)."""
    seq = f"  [{message.sequence}]"
    if isinstance(message, Tick | OHLC):
        return live_line(message) + seq
    kind = "snapshot" if isinstance(message, BookSnapshot) else "delta   "
    return (
        f"{timeparse.format_ms(message.exchange_time_ms)}  {message.ticker}  book {kind}  "
        f"#{message.exchange_sequence}  bids {len(message.bids)}  asks {len(message.asks)}" + seq
    )


def book_line(
    ticker: str, bids: list[Level], asks: list[Level], precision: Precision = _AS_THEY_COME
) -> str:
    """One line per book update: the best of each side and the spread, prices at the
    market's tick size (`Client.precision`)."""
    p = precision
    bid = f"{p.price(bids[0][0])} x {p.amount(bids[0][1])}" if bids else "-"
    ask = f"{p.price(asks[0][0])} x {p.amount(asks[0][1])}" if asks else "-"
    spread = p.price(price_difference(asks[0][0], bids[0][0])) if bids and asks else "-"
    return (
        f"{timeparse.format_ms(int(time.time() * 1000))}  {ticker}  book  bid {bid}  "
        f"ask {ask}  spread {spread}  levels {len(bids)}/{len(asks)}"
    )


def ladder_lines(
    bids: list[Level], asks: list[Level], precision: Precision = _AS_THEY_COME
) -> list[str]:
    """The ladder: asks above (best lowest, next to the spread), bids below, aligned;
    prices at the market's tick size, amounts at its lot size."""
    rows = [(price, amount) for price, amount in reversed(asks)]
    prices = [precision.price(p) for p, _ in (*rows, *bids)]
    amounts = [precision.amount(a) for _, a in (*rows, *bids)]
    width_p = max((len(p) for p in prices), default=0)
    width_a = max((len(a) for a in amounts), default=0)
    lines = []
    for i, (p, a) in enumerate(zip(prices, amounts, strict=True)):
        side = "ask" if i < len(rows) else "bid"
        lines.append(f"{side}  {p:>{width_p}}  {a:>{width_a}}")
    if rows and bids:
        spread = precision.price(price_difference(asks[0][0], bids[0][0]))
        lines.insert(len(rows), f"---  spread {spread}")
    return lines


class LadderView:
    """The live ladder: redrawn in place on a terminal (rich Live), else one line per update."""

    def __init__(self, out: Console, precision: Precision, *, redraw: bool) -> None:
        from rich.live import Live

        self._out = out
        self._precision = precision
        self._live = Live(console=out, auto_refresh=False, transient=False) if redraw else None

    def __enter__(self) -> LadderView:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, ticker: str, bids: list[Level], asks: list[Level], *, in_sync: bool) -> None:
        line = book_line(ticker, bids, asks, self._precision)
        line += "" if in_sync else "  (out of sync)"
        if self._live is None:
            self._out.print(line, markup=False)
            return
        from rich.text import Text

        lines = [line, *ladder_lines(bids, asks, self._precision)]
        self._live.update(Text("\n".join(lines)), refresh=True)

    def ladder(self, ticker: str, bids: list[Level], asks: list[Level]) -> None:
        self._out.print(book_line(ticker, bids, asks, self._precision), markup=False)
        for line in ladder_lines(bids, asks, self._precision):
            self._out.print(line, markup=False)
