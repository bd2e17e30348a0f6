"""The chaos soak itself, on whichever platform: clients at work while a fault injector
breaks one component at a time, then the data checked against the exchange's trades.

`run_soak` keeps clients busy (history requests of random past ranges, live ticks and
1-minute candles of the recorded markets with sequence checks, a book, one-shot CEP
triggers) while `Injector` applies the faults of an ``infra.chaos.FaultPlan`` through a
``infra.chaos_platforms.Breaker`` (`make run`'s processes or the compose containers)
and cuts the exchange through the simulator's control API. Each fault is logged with
its time, and the next one waits until every component is ready again.

Then, once the platform's gap repair had its chance (bounded by `settle_s`), it
checks the recorded markets against the simulator's own trades (`GET /_sim/trades`):
no trade missing or stored twice in ``market.ticks``, no closed 1-minute candle
missing or twice in ``market.ohlc``; every history request answered with rows or
refused with a code within 10 s of its fault; every trigger whose threshold the
market crossed fired exactly once. The rules are ``infra.chaos``'s; this module only
runs them. Callers: bench/chaos_soak.py (30 minutes against `make run`) and
e2e/test_chaos_soak.py (5 minutes on compose, in `make e2e`).
"""

from __future__ import annotations

import csv
import json
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from infra import chaos  # the rules: chaos.check_trades, chaos.grade_trigger, ...
from infra.chaos import COMPONENTS, EXCHANGE, Fault, FaultPlan, HistoryOutcome, Row
from infra.chaos_platforms import Breaker
from infra.compose_platform import ComposeError
from infra.exchange_sim.control import SimulatorControl
from infra.localstack.process import StackError
from infra.soak import say
from infra.testing import RecordedLake, epoch_ms, iso_ms
from mdclient import Client, ClientSettings
from mdclient.dispatch import SequenceEvent
from mdclient.errors import MdClientError, MdTimeout
from mdproto import contracts, topics
from mdproto.messages import OHLC, CEPTriggerEvent, Tick
from mdproto.tables import Gaps, Ohlc, Ticks

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
#: A trigger counts as due only on a crossing this long after its registration.
TRIGGER_MARGIN_MS = 10_000


def log(line: str) -> None:
    say(f"[chaos {time.strftime('%H:%M:%S')}] {line}")


@dataclass(frozen=True)
class SoakOptions:
    """How long and how hard (bench/chaos_soak.py's flags, with its defaults)."""

    minutes: float = 30.0  # how long faults go on (after the warm-up)
    warmup_s: float = 60.0  # clients before the first fault
    gap_s: float = 15.0  # quiet time between a recovery and the next fault
    freeze_s: float = 8.0  # a short freeze's length
    cut_s: float = 30.0  # an exchange or catalog cut
    recover_s: float = 600.0  # bound on one fault's recovery
    settle_s: float = 600.0  # bound on gap repair and rebuilds after the faults
    close_wait_s: float = 60.0  # after the faults, before the first settle check
    settle_every_s: float = 15.0  # between two settle checks
    history_every_s: float = 10.0
    history_timeout_s: float = 120.0
    trigger_every_s: float = 20.0
    seed: int = 45


@dataclass
class FaultRecord:
    """One injected fault, with its times (epoch ms) and what came of it."""

    target: str
    kind: str
    hold_s: float
    started_ms: int
    ended_ms: int = 0  # the fault lifted (SIGCONT, cut over) or the process gone
    recovered_ms: int = 0  # every component ready again (0: not within the bound)
    note: str = ""


@dataclass
class TriggerRecord:
    trigger_id: str
    ticker: str
    threshold: float
    registered_ms: int


@dataclass
class Clients:
    """What the clients saw; filled by their threads."""

    history: list[HistoryOutcome] = field(default_factory=list)
    live_messages: Counter[str] = field(default_factory=Counter)
    sequence: Counter[str] = field(default_factory=Counter)  # kind -> count
    missed: int = 0  # messages the sequence numbers say were lost live
    last_price: dict[str, float] = field(default_factory=dict)
    book_updates: int = 0
    book_events: Counter[str] = field(default_factory=Counter)
    triggers: list[TriggerRecord] = field(default_factory=list)
    trigger_refusals: list[str] = field(default_factory=list)
    fired: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    lock: threading.Lock = field(default_factory=threading.Lock)


class Injector:
    """Applies `infra.chaos.Fault`s through a `Breaker`; the exchange's cut through the
    simulator's control API (the same on every platform)."""

    def __init__(self, breaker: Breaker, sim: SimulatorControl, recover_s: float) -> None:
        self.breaker = breaker
        self.sim = sim
        self.recover_s = recover_s

    def apply(self, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault.target, fault.kind, fault.hold_s, _now_ms())
        log(f"fault: {fault.describe()}")
        breaker, target = self.breaker, fault.target
        if target == EXCHANGE:
            self._cut_exchange(fault.hold_s)
        elif fault.kind in ("kill", "restart"):
            before = breaker.run_id(target)
            (breaker.kill if fault.kind == "kill" else breaker.terminate)(target)
            if not self._until(lambda: breaker.run_id(target) != before, 60):
                record.note = "still the same run after 60 s"
        elif fault.kind in ("freeze", "cut"):
            breaker.freeze(target)
            try:
                time.sleep(fault.hold_s)
            finally:
                breaker.thaw(target)
        else:  # hang: the platform's liveness check must kill and restart it
            before = breaker.run_id(target)
            breaker.hang(target)
            if not self._until(lambda: breaker.run_id(target) != before, 120):
                record.note = "not restarted within 120 s; woken"
                breaker.wake(target)
        record.ended_ms = _now_ms()
        late = self.wait_ready(self.recover_s)
        if late:
            record.note = f"{record.note} not ready within {self.recover_s:g} s: {late}".strip()
        else:
            record.recovered_ms = _now_ms()
        took = (record.recovered_ms - record.started_ms) / 1000 if record.recovered_ms else None
        log(f"  recovered in {took:.1f} s" if took is not None else f"  {record.note}")
        return record

    def wait_ready(self, timeout_s: float) -> list[str]:
        """Until every component is ready; those that are not after `timeout_s`."""
        if self._until(lambda: not self.breaker.not_ready(COMPONENTS), timeout_s):
            return []
        return self.breaker.not_ready(COMPONENTS)

    def _cut_exchange(self, seconds: float) -> None:
        """Websockets closed and refused, REST answering 503, for `seconds`."""
        self.sim.add_fault("unavailable", count=1_000_000)
        self.sim.ws_outage(seconds=seconds)
        try:
            time.sleep(seconds)
        finally:
            self.sim.clear_faults("unavailable")
            self.sim.clear_faults("ws_outage")

    def _until(self, check: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline or not self.breaker.alive():
                return False
            time.sleep(1.0)
        return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def history_client(
    settings: ClientSettings,
    tickers: list[str],
    every_s: float,
    timeout_s: float,
    stop: threading.Event,
    seen: Clients,
    rng: random.Random,
) -> None:
    """A history request of a random past range (1 h to 8 days old, 10 min to 3 h long)
    of a random ticker every `every_s`, one at a time: rows, or a refusal with a code."""
    with Client(settings=settings, client_id="chaos-history") as client:
        while not stop.is_set():
            began = time.time()
            ticker = rng.choice(tickers)
            end = (_now_ms() - rng.randint(HOUR_MS, 8 * 24 * HOUR_MS)) // MINUTE_MS * MINUTE_MS
            start = end - rng.randint(10, 180) * MINUTE_MS
            try:
                result = client.history(ticker, "1m", start, end, timeout_s=timeout_s, attempts=1)
                times = result.table.column(Ohlc.OPEN_TIME).to_pylist()
                outcome = HistoryOutcome(
                    began, time.time(), "ok", len(times), len(times) - len(set(times))
                )
            except MdTimeout as exc:
                outcome = HistoryOutcome(began, time.time(), "unanswered", reason=str(exc))
            except MdClientError as exc:
                code = exc.error_code or type(exc).__name__
                outcome = HistoryOutcome(began, time.time(), "refused", reason=f"{code}: {exc}")
            with seen.lock:
                seen.history.append(outcome)
            log(
                f"history {ticker} {iso_ms(start)[:16]} +{(end - start) // MINUTE_MS} min: "
                f"{outcome.answer} {outcome.rows} rows in {outcome.ended_s - began:.1f} s "
                f"{outcome.reason[:120]}"
            )
            stop.wait(max(0.0, every_s - (time.time() - began)))


def live_clients(client: Client, tickers: list[str], book_ticker: str, seen: Clients) -> list[Any]:
    """Live ticks and 1-minute candles of every ticker (sequence events counted), a book."""

    def on_message(message: Tick | OHLC) -> None:
        with seen.lock:
            seen.live_messages[message.ticker] += 1
            if isinstance(message, Tick):
                seen.last_price[message.ticker] = message.price

    def on_sequence(event: SequenceEvent) -> None:
        with seen.lock:
            seen.sequence[event.kind] += 1
            seen.missed += event.missed
        log(f"live: {event.describe()}")

    def on_book(_book: object) -> None:
        with seen.lock:
            seen.book_updates += 1

    def on_book_event(event: Any) -> None:
        with seen.lock:
            seen.book_events[str(getattr(event, "kind", type(event).__name__))] += 1

    streams: list[Any] = [
        client.on_live(t, on_message, ticks=True, ohlc=["1m"], on_sequence=on_sequence)
        for t in tickers
    ]
    streams.append(client.book(book_ticker, callback=on_book, on_event=on_book_event))
    return streams


def trigger_client(
    client: Client, ticker: str, every_s: float, stop: threading.Event, seen: Clients
) -> None:
    """A one-shot `above:<last price>` trigger on `ticker` every `every_s`."""

    def on_event(_topic: str, message: Message) -> None:
        if isinstance(message, CEPTriggerEvent) and message.kind == CEPTriggerEvent.FIRED:
            with seen.lock:
                seen.fired[message.trigger_id].append(message.fire_count)

    watch = client.watch(topics.response_topic(client.client_id), on_event)
    try:
        while not stop.wait(every_s):
            with seen.lock:
                price = seen.last_price.get(ticker)
            if price is None:
                continue
            registered = _now_ms()
            try:
                ack = client.add_trigger(ticker, [f"above:{price}"], per_trigger=False)
            except MdClientError as exc:
                with seen.lock:
                    seen.trigger_refusals.append(f"{exc.error_code or type(exc).__name__}")
                log(f"trigger refused: {exc}")
                continue
            with seen.lock:
                seen.triggers.append(TriggerRecord(ack.trigger_id, ticker, price, registered))
    finally:
        watch.close()


def check_data(
    lake: RecordedLake, sim: SimulatorControl, tickers: list[str], begin_ms: int, end_ms: int
) -> tuple[list[Row], dict[str, Any]]:
    """The ticks and closed 1-minute candles of [begin, end) against the simulator's trades."""
    rows: list[Row] = []
    detail: dict[str, Any] = {}
    stored_ticks = lake.ticks(begin_ms)
    gaps = lake.gaps()
    candles = lake.rows(
        contracts.ICEBERG_OHLC,
        f"{Ohlc.TICKER} IN {lake._quoted} AND {Ohlc.PERIOD_SECONDS} = 60"
        f" AND {Ohlc.OPEN_TIME} >= '{iso_ms(begin_ms)}' AND {Ohlc.OPEN_TIME} < '{iso_ms(end_ms)}'",
    )
    candle_rows = candles.to_pylist() if candles is not None else []
    for ticker in tickers:
        traded = sim.trades(ticker.partition(":")[2], begin_ms, end_ms - 1)
        want = {
            str(t["id"]): (float(t["price"]), float(t["qty"]), int(t["time_ms"])) for t in traded
        }
        stored = [
            (r[Ticks.TRADE_ID], r[Ticks.PRICE], r[Ticks.AMOUNT], epoch_ms(r[Ticks.TRADE_TIME]))
            for r in stored_ticks
            if r[Ticks.TICKER] == ticker and epoch_ms(r[Ticks.TRADE_TIME]) < end_ms
        ]
        lost_ranges = [
            (int(g[Gaps.FROM_TRADE_ID]), int(g[Gaps.TO_TRADE_ID]))
            for g in gaps
            if g[Gaps.TICKER] == ticker and g[Gaps.STATUS] == "UNREPAIRABLE"
        ]
        ticks = chaos.check_trades(ticker, want, stored, lost_ranges)
        rows.append(
            Row(
                f"ticks {ticker}",
                items=ticks.traded,
                ok=ticks.stored - len(ticks.wrong),
                lost=ticks.lost,
                duplicated=len(ticks.duplicated),
                wrong=len(ticks.wrong),
                note=_note(unrepairable=len(ticks.unrepairable)),
            )
        )
        bars = chaos.check_candles(
            ticker,
            [(p, q, ms) for p, q, ms in want.values()],
            [
                (
                    epoch_ms(r[Ohlc.OPEN_TIME]),
                    r[Ohlc.CLOSE],
                    r[Ohlc.VOLUME],
                    r[Ohlc.TRADE_COUNT],
                )
                for r in candle_rows
                if r[Ohlc.TICKER] == ticker
            ],
            begin_ms,
            end_ms,
        )
        rows.append(
            Row(
                f"1m candles {ticker}",
                items=bars.expected,
                ok=bars.stored - len(bars.wrong),
                lost=len(bars.missing),
                duplicated=len(bars.duplicated),
                wrong=len(bars.wrong),
            )
        )
        detail[ticker] = {
            "ticks": asdict(ticks) | {"missing": ticks.missing[:50], "wrong": ticks.wrong[:50]},
            "candles": asdict(bars),
        }
    detail["gaps"] = [
        {k: str(v) for k, v in g.items()} for g in gaps if epoch_ms(g[Gaps.DETECTED_AT]) >= begin_ms
    ]
    return rows, detail


def _note(**counts: int) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v)


def settled(lake: RecordedLake, tickers: list[str], begin_ms: int, end_ms: int) -> bool:
    """Every market recorded past the window and no gap of the window still open."""
    newest = lake.newest_ms(end_ms)
    open_gaps = [g for g in lake.gaps(begin_ms) if g[Gaps.STATUS] in ("OPEN", "REPAIRING")]
    return all(newest.get(t, 0) >= end_ms for t in tickers) and not open_gaps


def trigger_row(
    seen: Clients, sim: SimulatorControl, lake: RecordedLake, end_ms: int
) -> tuple[Row, list[dict[str, Any]]]:
    """Each one-shot trigger graded against the simulator's prices after its registration,
    as the feed delivered them live (a gap's repaired trades are never checked)."""
    grades: Counter[str] = Counter()
    detail = []
    gaps = lake.gaps()
    for t in seen.triggers:
        # Due: the market crossed the threshold on a trade at least TRIGGER_MARGIN_MS
        # after the registration (its REGISTER record is in Kafka by then) and at least
        # as long before the window's end (its event had time to arrive).
        since = t.registered_ms + TRIGGER_MARGIN_MS
        ranges = [
            (int(g[Gaps.FROM_TRADE_ID]), int(g[Gaps.TO_TRADE_ID]))
            for g in gaps
            if g[Gaps.TICKER] == t.ticker
        ]
        # A trigger registered in the window's last moments cannot be due: its range of
        # trades is empty (the simulator refuses a negative one).
        first_ms = min(since - MINUTE_MS, end_ms)
        traded = sim.trades(t.ticker.partition(":")[2], first_ms, end_ms)
        trades = chaos.live_trades(traded, ranges)
        before = [float(x["price"]) for x in trades if int(x["time_ms"]) < since]
        after = [
            float(x["price"])
            for x in trades
            if since <= int(x["time_ms"]) <= end_ms - TRIGGER_MARGIN_MS
        ]
        due = chaos.crossed_above(after, t.threshold, before[-1] if before else None)
        grade = chaos.grade_trigger(seen.fired.get(t.trigger_id, []), due)
        grades[grade] += 1
        detail.append(asdict(t) | {"fired": seen.fired.get(t.trigger_id, []), "grade": grade})
    refusals = Counter(seen.trigger_refusals)
    note = ", ".join(
        [f"{grades['not_due']} never crossed"] * bool(grades["not_due"])
        + [f"refused: {r} x{n}" for r, n in refusals.items()]
    )
    row = Row(
        "one-shot triggers",
        items=len(seen.triggers) + len(seen.trigger_refusals),
        ok=grades["once"],
        refused=len(seen.trigger_refusals),
        lost=grades["lost"],
        duplicated=grades["duplicated"],
        note=note,
    )
    return row, detail


def table(rows: Sequence[Row], faults: Sequence[FaultRecord]) -> list[str]:
    """The soak's table (markdown), under a line counting the faults by kind."""
    kinds = Counter(f"{f.kind} {f.target}" for f in faults)
    lines = [
        f"faults injected: {len(faults)} ({', '.join(f'{k} x{n}' for k, n in kinds.items())})",
        "| check | items | OK | refused | lost | duplicated | wrong | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r.check} | {r.items} | {r.ok} | {r.refused} | {r.lost} | {r.duplicated}"
        f" | {r.wrong} | {r.note} |"
        for r in rows
    ]
    return lines


@dataclass
class SoakResult:
    """What a soak found: the table's rows, the faults, and the detail for result.json."""

    rows: list[Row]
    faults: list[FaultRecord]
    window: tuple[int, int]  # [begin, end) checked, epoch ms
    restarted: list[str]  # components running as another run than at the start
    not_ready: list[str]  # at the end: then "lost" ticks and candles may still be in Kafka
    aborted: str
    detail: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing duplicated, and the soak ran to its end."""
        return chaos.verdict(self.rows) and not self.aborted

    def report(self) -> list[str]:
        """The table and what to read beside it."""
        lines = ["", *table(self.rows, self.faults)]
        lines.append(f"components restarted: {', '.join(self.restarted) or 'none'}")
        lines.append(f"checked window [{iso_ms(self.window[0])}, {iso_ms(self.window[1])})")
        lines.extend(self.wrong_candles())
        if self.not_ready:
            lines.append(f"NOT READY at the end: {', '.join(self.not_ready)}")
        if self.aborted:
            lines.append(f"ABORTED: {self.aborted}")
        return lines

    def wrong_candles(self) -> list[str]:
        """Each wrong candle against its trades, and the window's gaps beside them: what
        a CI log needs to tell a rebuild not yet done from a wrong one."""
        markets = self.detail.get("markets", {})
        lines = [
            f"wrong candle {ticker} {iso_ms(int(open_ms))}: {why}"
            for ticker, found in markets.items()
            if ticker != "gaps"
            for open_ms, why in found["candles"]["why"].items()
        ]
        if lines:
            lines += [
                f"  gap {g[Gaps.TICKER]} {g[Gaps.CAUSE]} {g[Gaps.STATUS]} [{g[Gaps.FROM_TIME]},"
                f" {g[Gaps.TO_TIME]}] recovered {g[Gaps.TRADES_RECOVERED]} updated"
                f" {g[Gaps.UPDATED_AT]}"
                for g in markets.get("gaps", [])
            ]
        return lines


def write_results(out: Path, result: SoakResult) -> None:
    """`table.csv`, `faults.csv` and `result.json` (every fault, request and trigger)."""
    rows, faults = result.rows, result.faults
    out.mkdir(parents=True, exist_ok=True)
    with (out / "table.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(Row("").as_dict()))
        writer.writeheader()
        writer.writerows(r.as_dict() for r in rows)
    with (out / "faults.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(
            handle, fieldnames=list(asdict(faults[0]) if faults else ["target"])
        )
        writer.writeheader()
        writer.writerows(asdict(f) for f in faults)
    extra = {
        "window": list(result.window),
        "restarted": result.restarted,
        "not_ready_at_end": result.not_ready,
        "aborted": result.aborted,
        **result.detail,
    }
    body = {"rows": [r.as_dict() for r in rows], "faults": [asdict(f) for f in faults], **extra}
    (out / "result.json").write_text(json.dumps(body, indent=1, default=str))


def run_soak(
    breaker: Breaker,
    settings: ClientSettings,
    lake: RecordedLake,
    tickers: list[str],
    faults: Iterator[Fault],
    options: SoakOptions,
) -> SoakResult:
    """Clients on `tickers` (recorded markets: their ticks and candles are checked) while
    `faults` are injected for `options.minutes` after the warm-up (or until they run out),
    then the checks once the platform settled."""
    sim = SimulatorControl(breaker.exchange_url, timeout_s=30)
    injector = Injector(breaker, sim, options.recover_s)
    rng = random.Random(options.seed)
    seen = Clients()
    stop = threading.Event()
    window_over = threading.Event()  # no more triggers registered after the faults
    started = {c: breaker.run_id(c) for c in COMPONENTS}
    log(f"{breaker.label}: markets {', '.join(tickers)}; faults for {options.minutes:g} min")

    live = Client(settings=settings, client_id="chaos-live")
    cep = Client(settings=settings, client_id="chaos-cep")
    streams = live_clients(live, tickers, tickers[0], seen)
    # Checked from the first whole minute with every subscription 30 s old (the live
    # engine closes the candles of subscribed markets).
    begin_ms = ((_now_ms() + 30_000) // MINUTE_MS + 1) * MINUTE_MS
    threads = [
        threading.Thread(
            target=history_client,
            args=(
                settings,
                tickers,
                options.history_every_s,
                options.history_timeout_s,
                stop,
                seen,
                rng,
            ),
            daemon=True,
        ),
        threading.Thread(
            target=trigger_client,
            args=(cep, tickers[0], options.trigger_every_s, window_over, seen),
            daemon=True,
        ),
    ]
    for thread in threads:
        thread.start()

    plan = FaultPlan(
        crash_limit=breaker.crash_limit,
        crash_window_s=breaker.crash_window_s,
        gap_s=options.gap_s,
        freeze_s=options.freeze_s,
        faults=faults,
        first_at=time.monotonic() + options.warmup_s,
    )
    records: list[FaultRecord] = []
    deadline = time.monotonic() + options.warmup_s + options.minutes * 60
    aborted = ""
    while time.monotonic() < deadline and not plan.exhausted:
        if not breaker.alive():
            aborted = f"{breaker.label} stopped (its supervisor gave up or was stopped)"
            break
        fault = plan.next(time.monotonic())
        if fault is None:
            time.sleep(1.0)
            continue
        try:
            records.append(injector.apply(fault))
        except (StackError, ComposeError) as exc:  # e.g. the target was restarting
            log(f"  not injected: {exc}")
        plan.done(time.monotonic())
    end_ms = _now_ms() // MINUTE_MS * MINUTE_MS
    window_over.set()
    log(f"faults over ({len(records)}); clients run on until the platform settles")

    # Gap repair and candle rebuilds take a while: wait, bounded, then check.
    settle_deadline = time.monotonic() + options.settle_s
    time.sleep(options.close_wait_s)  # the window's last minute closes, its events arrive
    while not aborted and time.monotonic() < settle_deadline:
        if settled(lake, tickers, begin_ms, end_ms):
            rows, _ = check_data(lake, sim, tickers, begin_ms, end_ms)
            if chaos.settled_rows(rows):  # candles over repaired gaps rebuilt too
                break
        time.sleep(options.settle_every_s)
    stop.set()
    for thread in threads:
        thread.join(timeout=options.history_timeout_s + 30)
    for stream in streams:
        stream.close()
    live.close()
    cep.close()
    if aborted:  # the stores went down with the platform: nothing can be checked
        return SoakResult(
            rows=[], faults=records, window=(begin_ms, end_ms), restarted=[],
            not_ready=list(COMPONENTS), aborted=aborted, detail={},
        )  # fmt: skip

    rows, detail = check_data(lake, sim, tickers, begin_ms, end_ms)
    rows.append(chaos.history_row(seen.history, [f.started_ms / 1000 for f in records]))
    trig, trig_detail = trigger_row(seen, sim, lake, end_ms)
    rows.append(trig)
    rows.append(
        Row(
            "live ticks + 1m candles",
            items=sum(seen.live_messages.values()),
            ok=sum(seen.live_messages.values()),
            note=_note(
                gaps_reported=seen.sequence["gap"],
                messages_missed=seen.missed,
                restarts=seen.sequence["restart"],
                recovered=seen.sequence["recovered"],
                recovery_failed=seen.sequence["recovery_failed"],
            ),
        )
    )
    rows.append(
        Row(
            f"book {tickers[0]}",
            items=seen.book_updates,
            ok=seen.book_updates,
            note=", ".join(f"{k} {n}" for k, n in seen.book_events.items()),
        )
    )
    return SoakResult(
        rows=rows,
        faults=records,
        window=(begin_ms, end_ms),
        restarted=[c for c in COMPONENTS if breaker.run_id(c) != started[c]],
        not_ready=injector.wait_ready(60),  # a heartbeat may lapse under load: not one look
        aborted=aborted,
        detail={
            "markets": detail,
            "triggers": trig_detail,
            "history": [asdict(o) for o in seen.history],
        },
    )
