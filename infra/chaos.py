"""The pure parts of the chaos soak (bench/chaos_soak.py): its fault schedule and its checks.

The soak attaches to a running `make run`, breaks one part at a time while clients
use the platform, and at the end compares what the platform stored and answered
with what the exchange simulator traded. Everything here is free of I/O and takes
its clock as an argument, so that the unit tests (infra/tests/test_chaos.py) drive it
with synthetic histories.

Faults (`Fault.kind`):

- ``kill``: SIGKILL the component's process group; `make run`'s supervisor restarts it.
- ``restart``: SIGTERM it (a graceful stop); the supervisor restarts it.
- ``freeze``: SIGSTOP it for `freeze_s` (shorter than the supervisor's liveness
  probe needs to notice), then SIGCONT: a stall the component must ride out.
- ``hang``: SIGSTOP it and leave it: the supervisor's liveness probe kills and
  restarts it (ADR 0013). Only for components with a ``/healthz``; for the catalog,
  which has none, the same slot is a ``cut``.
- ``cut``: the exchange (the simulator closes and refuses its websockets and
  answers its REST with 503) or the catalog (SIGSTOP, SIGCONT after `cut_s`).

``kill``, ``restart`` and ``hang`` end in a supervisor restart, which counts against
its crash budget (PLATFORM_CRASH_LIMIT within PLATFORM_CRASH_WINDOW_S): the plan
never spends more than ``crash_limit - 1`` of it per component within the window,
so the soak never makes the platform give up, whatever its length.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FaultKind = Literal["kill", "restart", "freeze", "hang", "cut"]

#: The components the soak breaks, in `make run`'s names (the catalog is `iceberg-rest`);
#: the pipeline last in a round: its restart (a Spark start) takes minutes on 2 cores.
COMPONENTS = ("relay", "ingestor", "gateway", "iceberg-rest", "spark-pipeline")
#: The components `make run`'s supervisor probes for liveness (those with a `/healthz`).
PROBED = frozenset({"spark-pipeline", "ingestor", "relay", "gateway"})
#: The simulated exchange, a fault target beside the components.
EXCHANGE = "exchange"
CATALOG = "iceberg-rest"
#: What a component goes through, in turn.
KINDS: tuple[FaultKind, ...] = ("kill", "freeze", "restart", "hang")
#: Faults that end in a supervisor restart (they spend its crash budget).
RESTARTING: frozenset[str] = frozenset({"kill", "restart", "hang"})


@dataclass(frozen=True)
class Fault:
    """One fault: `target` (a component or EXCHANGE), its `kind`, how long it is held."""

    target: str
    kind: FaultKind
    hold_s: float = 0.0

    @property
    def restarts(self) -> bool:
        """The supervisor restarts the target afterwards (its crash budget is spent)."""
        return self.kind in RESTARTING

    def describe(self) -> str:
        held = f" for {self.hold_s:g} s" if self.hold_s else ""
        return f"{self.kind} {self.target}{held}"


def fault_cycle(
    components: Sequence[str] = COMPONENTS,
    *,
    freeze_s: float = 8.0,
    cut_s: float = 30.0,
) -> Iterator[Fault]:
    """Every component through every kind, in turn, forever: round r gives component i
    kind ``KINDS[(i + r) % 4]`` (so each round has a mix), and an exchange cut after
    the second component of every round. The catalog's ``hang`` is a ``cut``."""
    for round_ in itertools.count():
        for i, component in enumerate(components):
            kind = KINDS[(i + round_) % len(KINDS)]
            if kind == "hang" and component not in PROBED:
                yield Fault(component, "cut", cut_s)
            elif kind == "freeze":
                yield Fault(component, "freeze", freeze_s)
            else:
                yield Fault(component, kind)
            if i == 1:
                yield Fault(EXCHANGE, "cut", cut_s)


def compose_faults(*, freeze_s: float = 8.0, cut_s: float = 20.0) -> Iterator[Fault]:
    """The 5-minute soak's faults on compose (e2e/test_chaos_soak.py), once each: every
    kind and every component, in about 3 minutes of faults and recoveries on 2 cores.

    The pipeline is only frozen: its restart is a Spark start, minutes on compose,
    which a 5-minute window cannot wait for (the 30-minute soak restarts it). The
    faults that touch stored data come first, so that the checked window (whole
    minutes, up to the end of the faults) holds them: the ingestor's hang first, the
    longest recovery (the health check's watchdog, then a restart), whose gap is
    repaired and its candles rebuilt well before the check; the gateway, which no
    soak client uses, last. The relay, the only part every client goes through, is
    killed (a reset connection, refused at once), not hung: a hung relay is noticed
    by the SDK's heartbeat 6-8 s in, too near the 10 s bound for a test that must
    not fail one run in five. The catalog has no `/healthz`: cut, not hung."""
    yield Fault("ingestor", "hang")
    yield Fault("spark-pipeline", "freeze", freeze_s)
    yield Fault(EXCHANGE, "cut", cut_s)
    yield Fault(CATALOG, "cut", cut_s)
    yield Fault("relay", "kill")
    yield Fault("gateway", "restart")


@dataclass
class FaultPlan:
    """Which fault comes next, and when: at most one every `gap_s`, never more
    restarts of one component than the supervisor's budget allows.

    A restarting fault the budget forbids now becomes a freeze of `freeze_s` of the
    same component (it costs nothing); its kind comes round again in a later round.
    The caller injects, waits for the platform to recover, then calls `done` (the
    next one is due `gap_s` after that). A finite `faults` (`compose_faults`) ends
    the plan: `next` returns None from then on and `exhausted` is true.
    """

    crash_limit: int = 3
    crash_window_s: float = 300.0
    gap_s: float = 15.0
    freeze_s: float = 8.0
    faults: Iterator[Fault] = field(default_factory=fault_cycle)
    #: When the first fault is due (the clients warm up before).
    first_at: float = 0.0
    _restarts: dict[str, list[float]] = field(default_factory=dict)
    _due_at: float = field(init=False)
    exhausted: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._due_at = self.first_at

    def budget_left(self, target: str, now: float) -> int:
        """Restarts `target` may still take now, one of the budget kept for a real crash."""
        recent = [t for t in self._restarts.get(target, []) if now - t < self.crash_window_s]
        return max(0, self.crash_limit - 1 - len(recent))

    def next(self, now: float) -> Fault | None:
        """The fault to inject at `now`, or None (not due yet)."""
        if now < self._due_at:
            return None
        fault = next(self.faults, None)
        if fault is None:
            self.exhausted = True
            self._due_at = float("inf")
            return None
        if fault.restarts:
            if not self.budget_left(fault.target, now):
                fault = Fault(fault.target, "freeze", self.freeze_s)
            else:
                self._restarts.setdefault(fault.target, []).append(now)
        self._due_at = float("inf")  # until `done`
        return fault

    def done(self, now: float) -> None:
        """The last fault is over and the platform recovered: the next is due `gap_s` on."""
        self._due_at = now + self.gap_s


# ------------------------------------------------------------------ the checks


@dataclass(frozen=True)
class TradeCheck:
    """One market's stored trades against the exchange's over a window."""

    ticker: str
    traded: int
    stored: int
    missing: list[str]  # traded ids never stored (outside gaps reported unrepairable)
    unrepairable: list[str]  # traded ids not stored, inside a gap reported UNREPAIRABLE
    duplicated: list[str]  # ids stored more than once
    wrong: list[str]  # stored ids the exchange did not trade, or with other values

    @property
    def lost(self) -> int:
        return len(self.missing) + len(self.unrepairable)


def check_trades(
    ticker: str,
    traded: Mapping[str, tuple[float, float, int]],
    stored: Iterable[tuple[str, float, float, int]],
    unrepairable: Sequence[tuple[int, int]] = (),
) -> TradeCheck:
    """`traded`: trade id -> (price, amount, time ms) as the exchange has them; `stored`:
    (id, price, amount, time ms) rows of ``market.ticks`` in the same window.
    `unrepairable`: (from id, to id) of gaps the platform reported UNREPAIRABLE: ids
    strictly between are lost but said so (listed apart, still lost)."""
    seen: Counter[str] = Counter()
    wrong: list[str] = []
    for trade_id, price, amount, ms in stored:
        seen[trade_id] += 1
        want = traded.get(trade_id)
        if want is None or not _same(want, (price, amount, ms)):
            wrong.append(trade_id)
    absent = sorted(set(traded) - set(seen), key=_id_order)
    in_gap = [i for i in absent if any(a < _id_order(i) < b for a, b in unrepairable)]
    return TradeCheck(
        ticker=ticker,
        traded=len(traded),
        stored=len(seen),
        missing=[i for i in absent if i not in set(in_gap)],
        unrepairable=in_gap,
        duplicated=sorted((i for i, n in seen.items() if n > 1), key=_id_order),
        wrong=sorted(set(wrong), key=_id_order),
    )


def _same(a: tuple[float, float, int], b: tuple[float, float, int]) -> bool:
    return (
        abs(a[0] - b[0]) <= 1e-9 * abs(a[0])
        and abs(a[1] - b[1]) <= 1e-9 * abs(a[1])
        and (a[2] == b[2])
    )


def _id_order(trade_id: str) -> int:
    return int(trade_id) if trade_id.isdigit() else -1


@dataclass(frozen=True)
class CandleCheck:
    """One market's closed one-minute candles in ``market.ohlc`` over a window."""

    ticker: str
    expected: int  # minutes in which the exchange traded
    stored: int  # distinct minutes stored
    missing: list[int]  # open times (ms) of traded minutes with no candle
    duplicated: list[int]  # open times stored more than once
    wrong: list[int]  # candles whose close, volume or trade count differ from the trades
    #: open time -> "stored (close, volume, count) vs traded (...)", one per wrong candle
    why: dict[int, str] = field(default_factory=dict)


def check_candles(
    ticker: str,
    trades: Iterable[tuple[float, float, int]],
    candles: Iterable[tuple[int, float, float, int | None]],
    begin_ms: int,
    end_ms: int,
    period_ms: int = 60_000,
) -> CandleCheck:
    """`trades`: (price, amount, time ms) the exchange traded, oldest first; `candles`:
    (open time ms, close, volume, trade count or None) of the stored candles. Every
    period in [begin, end) (both on period boundaries) in which the exchange traded
    needs exactly one candle, whose close, volume and trade count match its trades."""
    want: dict[int, tuple[float, float, int]] = {}
    for price, amount, ms in trades:
        if begin_ms <= ms < end_ms:
            start = ms - ms % period_ms
            _, volume, count = want.get(start, (0.0, 0.0, 0))
            want[start] = (price, volume + amount, count + 1)
    seen: Counter[int] = Counter()
    why: dict[int, str] = {}
    for open_ms, close, volume, trade_count in candles:
        if not begin_ms <= open_ms < end_ms:
            continue
        seen[open_ms] += 1
        expected = want.get(open_ms)
        if (
            expected is None
            or abs(expected[0] - close) > 1e-9 * abs(close)
            or abs(expected[1] - volume) > 1e-6 * max(abs(volume), 1e-9)
            or (trade_count is not None and trade_count != expected[2])
        ):
            traded = (
                "no trades"
                if expected is None
                else f"traded ({expected[0]!r}, {expected[1]!r}, {expected[2]})"
            )
            why[open_ms] = f"stored ({close!r}, {volume!r}, {trade_count}) vs {traded}"
    return CandleCheck(
        ticker=ticker,
        expected=len(want),
        stored=len(seen),
        missing=sorted(set(want) - set(seen)),
        duplicated=sorted(t for t, n in seen.items() if n > 1),
        wrong=sorted(why),
        why=why,
    )


#: How long after its fault a request may take to be refused (issue 45: "within 10 s").
REFUSAL_BOUND_S = 10.0

Answer = Literal["ok", "refused", "late", "lost", "duplicated"]


@dataclass(frozen=True)
class HistoryOutcome:
    """One history request: sent and answered (epoch s), how, and why if not with rows."""

    sent_s: float
    ended_s: float
    answer: Literal["ok", "refused", "unanswered"]
    rows: int = 0
    repeated_rows: int = 0  # candles of one open time answered more than once
    reason: str = ""


def grade_history(outcome: HistoryOutcome, fault_starts: Sequence[float]) -> Answer:
    """ok: rows, none twice; refused: a refusal (code and reason) within REFUSAL_BOUND_S
    of the later of its sending and the last fault before its answer; late: a refusal
    after that; lost: no answer at all; duplicated: a candle answered twice."""
    if outcome.answer == "unanswered":
        return "lost"
    if outcome.repeated_rows:
        return "duplicated"
    if outcome.answer == "ok":
        return "ok"
    before = [t for t in fault_starts if t <= outcome.ended_s]
    since = max([outcome.sent_s, *before[-1:]])
    return "refused" if outcome.ended_s - since <= REFUSAL_BOUND_S else "late"


def crossed_above(prices: Iterable[float], threshold: float, previous: float | None) -> bool:
    """A one-shot `above:threshold` fires on these prices: some price is above it right
    after one at or below it (docs/cep.md "Edges, not levels"); `previous`: the last
    price before them (None: unknown, the first point has none)."""
    last = previous
    for price in prices:
        if last is not None and last <= threshold < price:
            return True
        last = price
    return False


def live_trades(
    trades: Sequence[Mapping[str, Any]], gaps: Sequence[tuple[int, int]]
) -> list[Mapping[str, Any]]:
    """The exchange's trades (``id`` keys) that the feed delivered live: those strictly
    inside a gap's (from id, to id) came later by repair, which triggers never see
    (docs/cep.md "Live trades only")."""
    return [t for t in trades if not any(a < int(t["id"]) < b for a, b in gaps)]


TriggerGrade = Literal["once", "not_due", "lost", "duplicated"]


def grade_trigger(fire_counts: Sequence[int], due: bool) -> TriggerGrade:
    """A one-shot trigger's FIRED events (their ``fire_count``s, repeats included: events
    are at-least-once, a repeat has the same count): once; duplicated (a second
    distinct firing); lost (the market crossed its threshold, it never fired); not due."""
    distinct = set(fire_counts)
    if len(distinct) > 1 or distinct - {1}:
        return "duplicated"
    if distinct:
        return "once"
    return "lost" if due else "not_due"


@dataclass
class Row:
    """One line of the soak's table."""

    check: str
    items: int = 0
    ok: int = 0
    refused: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0  # stored with other values than the exchange's (e.g. not yet rebuilt)
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def history_row(outcomes: Sequence[HistoryOutcome], fault_starts: Sequence[float]) -> Row:
    """The history requests' line: late refusals count as lost (no answer in time)."""
    grades = Counter(grade_history(o, fault_starts) for o in outcomes)
    reasons = Counter(
        o.reason.split(":")[0] for o in outcomes if grade_history(o, fault_starts) == "refused"
    )
    note = ", ".join(f"{r} x{n}" for r, n in reasons.most_common())
    if grades["late"]:
        note = f"{note}; {grades['late']} refused later than {REFUSAL_BOUND_S:g} s".lstrip("; ")
    return Row(
        "history requests",
        items=len(outcomes),
        ok=grades["ok"],
        refused=grades["refused"],
        lost=grades["lost"] + grades["late"],
        duplicated=grades["duplicated"],
        note=note,
    )


def verdict(rows: Sequence[Row]) -> bool:
    """The soak passes when nothing was lost and nothing duplicated."""
    return all(r.lost == 0 and r.duplicated == 0 for r in rows)


def settled_rows(rows: Sequence[Row]) -> bool:
    """Nothing lost, duplicated or wrong: the repairs and rebuilds the soak waits for are
    done (wrong values do not fail the soak, they are reported)."""
    return verdict(rows) and all(r.wrong == 0 for r in rows)
