"""Chaos soak of a running `make run`: clients at work while every component is broken in turn.

    nice -n 10 make run                                         # one shell
    .venv/bin/python bench/chaos_soak.py --minutes 5            # another

For `--minutes` it keeps clients busy (history requests of random past ranges, live
ticks and 1-minute candles of the recorded markets with sequence checks, a book,
one-shot CEP triggers) while a fault injector, one fault at a time, SIGKILLs,
freezes (SIGSTOP, SIGCONT a few seconds later, or left to the supervisor's liveness
restart) and restarts (SIGTERM) the pipeline, the ingestor, the relay, the gateway
and the catalog, and cuts the exchange (the simulator closes and refuses its
websockets and answers REST with 503) and the catalog (SIGSTOP) for a while. The
schedule is `infra.chaos.FaultPlan`: it never spends more of `make run`'s crash
budget than it can afford. Each fault is logged with its time.

Then, once the platform's gap repair had its chance (bounded by `--settle-s`), it
checks the recorded markets (PLATFORM_RECORD: BTC, ETH, SOL of the first exchange)
against the simulator's own trades (`GET /_sim/trades`): no trade missing or stored
twice in ``market.ticks``, no closed 1-minute candle missing or twice in
``market.ohlc``; every history request answered with rows or refused with a code
within 10 s of its fault; every trigger whose threshold the market crossed fired
exactly once. It prints a table, writes it with the fault log as JSON and CSV
(`--out`), and exits 0 only when nothing was lost and nothing duplicated.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from infra.chaos import (
    COMPONENTS,
    EXCHANGE,
    Fault,
    FaultPlan,
    HistoryOutcome,
    Row,
    check_candles,
    check_trades,
    crossed_above,
    fault_cycle,
    grade_trigger,
    history_row,
    live_trades,
    settled_rows,
    verdict,
)
from infra.exchange_sim.control import SimulatorControl
from infra.localstack.components import NotReadyError
from infra.localstack.process import PidFile, StackError
from infra.platform.__main__ import SUPERVISOR_PID_FILE
from infra.platform.config import PlatformConfig
from infra.platform.supervisor import Platform
from infra.soak import pids, say
from infra.testing import RecordedLake, epoch_ms, iso_ms
from mdclient import Client, ClientSettings
from mdclient.dispatch import SequenceEvent
from mdclient.errors import MdClientError, MdTimeout
from mdproto import contracts, topics
from mdproto.messages import OHLC, CEPTriggerEvent, Tick
from mdproto.tables import Gaps, Ohlc, Ticks

REPO = Path(__file__).resolve().parents[1]
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
#: A trigger counts as due only on a crossing this long after its registration.
TRIGGER_MARGIN_MS = 10_000


def log(line: str) -> None:
    say(f"[chaos {time.strftime('%H:%M:%S')}] {line}")


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
    """Applies `infra.chaos.Fault`s to the running platform through its pid files."""

    def __init__(self, platform: Platform, sim: SimulatorControl, recover_s: float) -> None:
        self.platform = platform
        self.sim = sim
        self.recover_s = recover_s
        self.components = {c.name: c for phase in platform.phases for c in phase.components}

    def pid(self, name: str) -> int | None:
        record = PidFile(self.platform._phase_of(name).run_dir / f"{name}.pid").read()
        return record.pid if record is not None and record.alive else None

    def ready(self, name: str) -> bool:
        if self.pid(name) is None:
            return False
        try:
            self.components[name].probe()
        except (NotReadyError, OSError, StackError):
            return False
        return True

    def supervisor_alive(self) -> bool:
        record = PidFile(self.platform.config.data_dir / "run" / SUPERVISOR_PID_FILE).read()
        return record is not None and record.alive

    def apply(self, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault.target, fault.kind, fault.hold_s, _now_ms())
        log(f"fault: {fault.describe()}")
        if fault.target == EXCHANGE:
            self._cut_exchange(fault.hold_s)
        elif fault.kind in ("kill", "restart"):
            before = self.pid(fault.target)
            sig = signal.SIGKILL if fault.kind == "kill" else signal.SIGTERM
            self.platform.send_signal(fault.target, sig)
            self._until(lambda: self.pid(fault.target) != before, 60)
        elif fault.kind in ("freeze", "cut"):
            self.platform.send_signal(fault.target, signal.SIGSTOP)
            time.sleep(fault.hold_s)
            self.platform.send_signal(fault.target, signal.SIGCONT)
        else:  # hang: the supervisor's liveness probe must kill and restart it
            before = self.pid(fault.target)
            self.platform.send_signal(fault.target, signal.SIGSTOP)
            if not self._until(lambda: self.pid(fault.target) != before, 120):
                record.note = "not restarted within 120 s; SIGCONT sent"
                self.platform.send_signal(fault.target, signal.SIGCONT)
        record.ended_ms = _now_ms()
        if self._until(lambda: all(self.ready(c) for c in COMPONENTS), self.recover_s):
            record.recovered_ms = _now_ms()
        else:
            late = [c for c in COMPONENTS if not self.ready(c)]
            record.note = f"{record.note} not ready within {self.recover_s:g} s: {late}".strip()
        took = (record.recovered_ms - record.started_ms) / 1000 if record.recovered_ms else None
        log(f"  recovered in {took:.1f} s" if took is not None else f"  {record.note}")
        return record

    def _cut_exchange(self, seconds: float) -> None:
        """Websockets closed and refused, REST answering 503, for `seconds`."""
        self.sim.add_fault("unavailable", count=1_000_000)
        self.sim.ws_outage(seconds=seconds)
        time.sleep(seconds)
        self.sim.clear_faults("unavailable")
        self.sim.clear_faults("ws_outage")

    def _until(self, check: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline or not self.supervisor_alive():
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


def recorded_tickers(config: PlatformConfig) -> list[str]:
    return [f"{config.prefixes[0]}:{m}" for m in config.record]


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
        ticks = check_trades(ticker, want, stored, lost_ranges)
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
        bars = check_candles(
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
        traded = sim.trades(t.ticker.partition(":")[2], since - MINUTE_MS, end_ms)
        trades = live_trades(traded, ranges)
        before = [float(x["price"]) for x in trades if int(x["time_ms"]) < since]
        after = [
            float(x["price"])
            for x in trades
            if since <= int(x["time_ms"]) <= end_ms - TRIGGER_MARGIN_MS
        ]
        due = crossed_above(after, t.threshold, before[-1] if before else None)
        grade = grade_trigger(seen.fired.get(t.trigger_id, []), due)
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


def print_table(rows: list[Row], faults: list[FaultRecord]) -> None:
    kinds = Counter(f"{f.kind} {f.target}" for f in faults)
    say(f"\nfaults injected: {len(faults)} ({', '.join(f'{k} x{n}' for k, n in kinds.items())})")
    say("| check | items | OK | refused | lost | duplicated | wrong | note |")
    say("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        say(
            f"| {r.check} | {r.items} | {r.ok} | {r.refused} | {r.lost} | {r.duplicated}"
            f" | {r.wrong} | {r.note} |"
        )


def write_results(
    out: Path, rows: list[Row], faults: list[FaultRecord], extra: dict[str, Any]
) -> None:
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
    body = {"rows": [r.as_dict() for r in rows], "faults": [asdict(f) for f in faults], **extra}
    (out / "result.json").write_text(json.dumps(body, indent=1, default=str))


def soak(args: argparse.Namespace) -> int:
    config = PlatformConfig()
    platform = Platform(config, use_simulator=True, log=lambda _: None)
    assert platform.exchange_url is not None
    sim = SimulatorControl(platform.exchange_url, timeout_s=30)
    injector = Injector(platform, sim, args.recover_s)
    if not injector.supervisor_alive():
        print(f"no `make run` supervising {config.data_dir}: start it first", file=sys.stderr)
        return 2
    tickers = recorded_tickers(config)
    stack = platform.stack.endpoints
    lake = RecordedLake(stack.catalog_name, stack.pyiceberg_catalog_properties(), tickers)
    rng = random.Random(args.seed)
    seen = Clients()
    stop = threading.Event()
    window_over = threading.Event()  # no more triggers registered after the faults
    settings = ClientSettings()
    started_pids = pids(config.data_dir)
    log(f"recorded markets {', '.join(tickers)}; faults for {args.minutes:g} min")

    live = Client(settings=settings, client_id="chaos-live")
    cep = Client(settings=settings, client_id="chaos-cep")
    streams = live_clients(live, tickers, tickers[0], seen)
    # Checked from the first whole minute with every subscription 30 s old (the live
    # engine closes the candles of subscribed markets).
    begin_ms = ((_now_ms() + 30_000) // MINUTE_MS + 1) * MINUTE_MS
    threads = [
        threading.Thread(
            target=history_client,
            args=(settings, tickers, args.history_every_s, args.history_timeout_s, stop, seen, rng),
            daemon=True,
        ),
        threading.Thread(
            target=trigger_client,
            args=(cep, tickers[0], args.trigger_every_s, window_over, seen),
            daemon=True,
        ),
    ]
    for thread in threads:
        thread.start()

    plan = FaultPlan(
        crash_limit=config.crash_limit,
        crash_window_s=config.crash_window_s,
        gap_s=args.gap_s,
        freeze_s=args.freeze_s,
        faults=fault_cycle(freeze_s=args.freeze_s, cut_s=args.cut_s),
        first_at=time.monotonic() + args.warmup_s,
    )
    faults: list[FaultRecord] = []
    deadline = time.monotonic() + args.warmup_s + args.minutes * 60
    aborted = ""
    while time.monotonic() < deadline:
        if not injector.supervisor_alive():
            aborted = "`make run` stopped (its supervisor gave up or was stopped)"
            break
        fault = plan.next(time.monotonic())
        if fault is None:
            time.sleep(1.0)
            continue
        try:
            faults.append(injector.apply(fault))
        except StackError as exc:  # the target was not running (a restart under way)
            log(f"  not injected: {exc}")
        plan.done(time.monotonic())
    end_ms = _now_ms() // MINUTE_MS * MINUTE_MS
    window_over.set()
    log(f"faults over ({len(faults)}); clients run on until the platform settles")

    # Gap repair and candle rebuilds take a while: wait, bounded, then check.
    settle_deadline = time.monotonic() + args.settle_s
    time.sleep(MINUTE_MS / 1000)  # the window's last minute closes, its events arrive
    while not aborted and time.monotonic() < settle_deadline:
        if settled(lake, tickers, begin_ms, end_ms):
            rows, detail = check_data(lake, sim, tickers, begin_ms, end_ms)
            if settled_rows(rows):  # candles over repaired gaps rebuilt too
                break
        time.sleep(15.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=args.history_timeout_s + 30)
    for stream in streams:
        stream.close()
    live.close()
    cep.close()
    if aborted:  # the stores went down with the platform: nothing can be checked
        say(f"ABORTED: {aborted}; the end of `make run`'s output says why")
        write_results(
            Path(args.out), [], faults, {"window": [begin_ms, end_ms], "aborted": aborted}
        )
        say(f"FAIL: fault log in {args.out}")
        return 1

    rows, detail = check_data(lake, sim, tickers, begin_ms, end_ms)
    fault_starts = [f.started_ms / 1000 for f in faults]
    rows.append(history_row(seen.history, fault_starts))
    trig, trig_detail = trigger_row(seen, sim, lake, end_ms)
    rows.append(trig)
    live_row = Row(
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
    book_row = Row(
        f"book {tickers[0]}",
        items=seen.book_updates,
        ok=seen.book_updates,
        note=", ".join(f"{k} {n}" for k, n in seen.book_events.items()),
    )
    rows += [live_row, book_row]
    restarted = sorted(
        k for k, v in pids(config.data_dir).items() if started_pids.get(k) not in (None, v)
    )
    not_ready = [c for c in COMPONENTS if not injector.ready(c)]
    print_table(rows, faults)
    say(f"components with a new pid: {', '.join(restarted) or 'none'}")
    window = f"[{iso_ms(begin_ms)}, {iso_ms(end_ms)})"
    say(f"checked window {window}")
    if not_ready:  # then "lost" ticks and candles may still wait in Kafka
        say(f"NOT READY at the end: {', '.join(not_ready)}")
    write_results(
        Path(args.out),
        rows,
        faults,
        {
            "window": [begin_ms, end_ms],
            "markets": detail,
            "triggers": trig_detail,
            "history": [asdict(o) for o in seen.history],
            "restarted": restarted,
            "not_ready_at_end": not_ready,
        },
    )
    ok = verdict(rows)
    say(f"{'PASS' if ok else 'FAIL'}: results in {args.out}")
    return 0 if ok else 1


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults go on")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="clients before faults")
    parser.add_argument("--gap-s", type=float, default=15.0, help="quiet time between faults")
    parser.add_argument("--freeze-s", type=float, default=8.0, help="a short freeze's length")
    parser.add_argument("--cut-s", type=float, default=30.0, help="an exchange or catalog cut")
    parser.add_argument("--recover-s", type=float, default=600.0, help="bound on a recovery")
    parser.add_argument("--settle-s", type=float, default=600.0, help="bound on gap repair")
    parser.add_argument("--history-every-s", type=float, default=10.0)
    parser.add_argument("--history-timeout-s", type=float, default=120.0)
    parser.add_argument("--trigger-every-s", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--out", default=str(REPO / ".data" / "chaos-soak"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(soak(parser.parse_args()))


if __name__ == "__main__":
    main()
