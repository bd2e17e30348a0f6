"""The CEP engine: every registered trigger, evaluated tick by tick. Pure, single-threaded.

A trigger watches one series (raw ticks, or closed candles of one period).
Conditions fire on edges (false -> true between consecutive points), a sequence
when the second edge follows the first within `within`; one-shot triggers are
done after their first fire, expiry is processing time. Semantics in full:
docs/cep.md. Thresholds are indexed and windows shared per (series, window), so
a tick costs in the triggers it crosses, not the triggers registered.
"""

from __future__ import annotations

import heapq
import pickle
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mdproto.recent import RecentKeys
from pipeline.cep.candles import ArrivalCandle, CandleBuilder
from pipeline.cep.model import Condition, Kind, Notice, NoticeKind, TriggerSpec
from pipeline.cep.thresholds import Member, ThresholdIndex
from pipeline.cep.windows import ExtremaWindow, VolumeWindow

SeriesKey = tuple[str, int]  # (ticker, period_seconds)
#: Trade ids per ticker saved with its partition's state: a redelivered trade follows
#: its first copy within seconds (in memory: `dedupe_capacity` of them).
RECENT_SAVED = 1_000


def _anyone(_ticker: str) -> bool:
    """One engine owns every ticker (the default)."""
    return True


@dataclass(slots=True)
class Hit:
    member: Member
    threshold: float
    values: dict[str, float]


class Series:
    """One ticker's ticks or candles of one period, and the condition indexes on it."""

    def __init__(self, ticker: str, period_seconds: int, last_price: float | None) -> None:
        self.ticker = ticker
        self.period_seconds = period_seconds
        self.last_price = last_price
        self.last_time: int | None = None
        self.seq = 0  # points seen
        self.members = 0
        self.above = ThresholdIndex()
        self.below = ThresholdIndex()
        self.pct: dict[int, tuple[ExtremaWindow, ThresholdIndex]] = {}
        self.volume: dict[int, tuple[VolumeWindow, ThresholdIndex]] = {}
        self.candles = CandleBuilder(period_seconds) if period_seconds else None

    def __getstate__(self) -> dict[str, Any]:
        """Prices and windows only: the indexes are rebuilt from the specs (`Engine`)."""
        state = self.__dict__.copy()
        state.update(above=None, below=None, members=0)
        state["pct"] = {w: pair[0] for w, pair in self.pct.items()}
        state["volume"] = {w: pair[0] for w, pair in self.volume.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.above, self.below = ThresholdIndex(), ThresholdIndex()
        self.pct = {w: (window, ThresholdIndex()) for w, window in state["pct"].items()}
        self.volume = {w: (window, ThresholdIndex()) for w, window in state["volume"].items()}

    def dump(self) -> dict[str, Any]:
        """Prices, windows and the open candle (JSON: the live engine's partition state)."""
        return {
            "period": self.period_seconds,
            "last_price": self.last_price,
            "last_time": self.last_time,
            "seq": self.seq,
            "pct": {str(w): pair[0].dump() for w, pair in self.pct.items()},
            "volume": {str(w): pair[0].dump() for w, pair in self.volume.items()},
            "candles": None if self.candles is None else self.candles.dump(),
        }

    def load(self, d: dict[str, Any]) -> None:
        """What `dump` saved, into the windows this engine's triggers use (a window no
        trigger uses any more is skipped; a new one stays empty)."""
        self.last_price, self.last_time, self.seq = d["last_price"], d["last_time"], d["seq"]
        for w, points in d["pct"].items():
            if int(w) in self.pct:
                self.pct[int(w)][0].load(points)
        for w, points in d["volume"].items():
            if int(w) in self.volume:
                self.volume[int(w)][0].load(points)
        if self.candles is not None and d["candles"] is not None:
            self.candles.load(d["candles"])

    def reset(self) -> None:
        """Forget every point (the ticker's state is another engine's now)."""
        self.last_price = self.last_time = None
        self.seq = 0
        self.pct = {w: (ExtremaWindow(w), index) for w, (_, index) in self.pct.items()}
        self.volume = {w: (VolumeWindow(w), index) for w, (_, index) in self.volume.items()}
        self.candles = CandleBuilder(self.period_seconds) if self.period_seconds else None

    def add(self, cond: Condition, member: Member) -> None:
        self._index(cond, create=True).add(cond.threshold, member)
        self.members += 1

    def remove(self, cond: Condition, member: Member) -> None:
        index = self._index(cond, create=False)
        if index.remove(cond.threshold, member):
            self.members -= 1
        if len(index) == 0:  # a window nobody uses costs work on every point
            if cond.kind is Kind.PCT_MOVE:
                self.pct.pop(cond.window_ms, None)
            elif cond.kind is Kind.VOLUME_OVER:
                self.volume.pop(cond.window_ms, None)

    def _index(self, cond: Condition, *, create: bool) -> ThresholdIndex:
        if cond.kind is Kind.PRICE_ABOVE:
            return self.above
        if cond.kind is Kind.PRICE_BELOW:
            return self.below
        if cond.kind is Kind.PCT_MOVE:
            pct = self.pct.get(cond.window_ms)
            if pct is None:
                pct = (ExtremaWindow(cond.window_ms), ThresholdIndex())
                if create:
                    self.pct[cond.window_ms] = pct
            return pct[1]
        vol = self.volume.get(cond.window_ms)
        if vol is None:
            vol = (VolumeWindow(cond.window_ms), ThresholdIndex())
            if create:
                self.volume[cond.window_ms] = vol
        return vol[1]

    def point(self, time_ms: int, price: float, amount: float) -> list[Hit]:
        """Add one point; the condition edges it produced."""
        t = time_ms if self.last_time is None else max(time_ms, self.last_time)
        self.seq += 1
        hits: list[Hit] = []
        for window_ms, (vol, index) in self.volume.items():
            before = vol.evict(t)
            after = vol.add(t, amount)
            if after > before:
                values = {"volume": after, "window_s": window_ms / 1000}
                hits += [Hit(m, th, values) for th, m in index.open_closed(before, after)]
        prev = self.last_price
        for window_ms, (ext, index) in self.pct.items():
            ext.evict(t)
            before = ext.move(prev)[0] if prev is not None else 0.0
            ext.add(t, price)
            after, signed = ext.move(price)
            if after > before:
                values = {
                    "pct": signed,
                    "price": price,
                    "ref_price": ext.reference(signed),
                    "window_s": window_ms / 1000,
                }
                hits += [Hit(m, th, values) for th, m in index.open_closed(before, after)]
        if prev is not None and price != prev:
            values = {"price": price, "prev_price": prev}
            if price > prev:
                crossed = self.above.closed_open(prev, price)
            else:
                crossed = self.below.open_closed(price, prev)
            hits += [Hit(m, th, values) for th, m in crossed]
        self.last_price = price
        self.last_time = t
        return hits


class RecentIds(RecentKeys[str]):
    """Reads the trade-id memory of snapshots written before it moved to
    `mdproto.recent` (slots `_order`, `_seen`, `capacity`); new ones pickle RecentKeys."""

    __slots__ = ()

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        _, slots = state
        if "_keys" in slots:
            self._keys, self._capacity = slots["_keys"], slots["_capacity"]
        else:
            self._keys = OrderedDict.fromkeys(slots["_order"])
            self._capacity = slots["capacity"]


@dataclass  # no slots: see ArrivalCandle
class _Pending:
    """The first condition of a sequence happened: when, on which point, with what values."""

    time_ms: int
    seq: int
    values: dict[str, float]


@dataclass  # no slots: see ArrivalCandle
class _Trigger:
    spec: TriggerSpec
    serial: int
    fire_count: int = 0
    pending: _Pending | None = None
    _blob: bytes | None = None

    def blob(self) -> bytes:
        """The pickled spec (immutable, so pickled once: snapshots stay cheap)."""
        if self._blob is None:
            self._blob = pickle.dumps(self.spec, 5)
        return self._blob


class Engine:
    """All triggers of the pipeline. Methods return the notices to publish, in order."""

    def __init__(self, *, candle_grace_ms: int = 2000, dedupe_capacity: int = 10_000) -> None:
        self.candle_grace_ms = candle_grace_ms
        self.dedupe_capacity = dedupe_capacity
        self._triggers: dict[str, _Trigger] = {}
        self._series: dict[SeriesKey, Series] = {}
        self._by_ticker: dict[str, list[Series]] = {}
        self._last_price: dict[str, float] = {}
        self._recent: dict[str, RecentKeys[str]] = {}
        self._expiries: list[tuple[int, int, str]] = []  # heap of (expires_at, serial, id)
        #: Due expiries of tickers another engine owns: kept until this one owns them or
        #: the owner's tombstone cancels the trigger (`advance`).
        self._overdue: list[tuple[int, int, str]] = []
        self._serial = 0
        self._lineage = uuid.uuid4().hex[:12]
        self._defs_version = 0
        self._restore: list[tuple[int, int, _Pending | None]] | None = None
        #: Triggers the engine finished (one-shot fired, expired): to tombstone in Kafka.
        self.retired: list[str] = []
        self.stats: Counter[str] = Counter()

    # --- snapshots ---------------------------------------------------------------------
    # A snapshot is two parts: the trigger definitions, which change only when a
    # trigger is added or removed (`definitions`, written by the store once per
    # `definitions_id`), and everything else, pickled every micro-batch.

    @property
    def definitions_id(self) -> str:
        """Names the current set of triggers: lineage (this engine) + change counter."""
        return f"{self._lineage}-{self._defs_version}"

    def definitions(self) -> list[bytes]:
        """The pickled specs, in the order `__getstate__` lists the triggers' state."""
        return [t.blob() for t in self._triggers.values()]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_triggers"] = [(t.serial, t.fire_count, t.pending) for t in self._triggers.values()]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_overdue", [])  # snapshots from before sharded expiries
        self._restore = state["_triggers"]  # until restore_definitions
        self._triggers = {}
        # A new lineage: the run that crashed may have written definitions under the
        # ids this engine would use next, for a different set of triggers.
        self._lineage = uuid.uuid4().hex[:12]
        self._defs_version = 0

    def restore_definitions(self, definitions: list[bytes]) -> None:
        """Second half of unpickling: the specs saved for this state's definitions_id."""
        saved, self._restore = self._restore, None
        assert saved is not None, "restore_definitions is for freshly unpickled engines"
        for blob, (serial, fire_count, pending) in zip(definitions, saved, strict=True):
            spec: TriggerSpec = pickle.loads(blob)
            self._triggers[spec.trigger_id] = _Trigger(spec, serial, fire_count, pending, blob)
            series = self._series[(spec.ticker, spec.period_seconds)]
            for i, cond in enumerate(spec.conditions):
                series.add(cond, (spec.trigger_id, i))

    # --- registry ---------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._triggers)

    def __contains__(self, trigger_id: object) -> bool:
        return trigger_id in self._triggers

    def specs(self) -> list[TriggerSpec]:
        return [t.spec for t in self._triggers.values()]

    def fire_count(self, trigger_id: str) -> int:
        trigger = self._triggers.get(trigger_id)
        return trigger.fire_count if trigger else 0

    def register(self, spec: TriggerSpec, now_ms: int) -> list[Notice]:
        """Add (or replace: same trigger_id) a trigger; ARMED, or EXPIRED if already past."""
        self._drop(spec.trigger_id)
        if spec.expires_at_ms and spec.expires_at_ms <= now_ms:
            self.retired.append(spec.trigger_id)
            self.stats["expired"] += 1
            return [_notice(NoticeKind.EXPIRED, spec, now_ms, 0, final=True, text="expired")]
        self._serial += 1
        self._defs_version += 1
        trigger = _Trigger(spec, self._serial)
        self._triggers[spec.trigger_id] = trigger
        series = self._series_for(spec)
        for i, cond in enumerate(spec.conditions):
            series.add(cond, (spec.trigger_id, i))
        if spec.expires_at_ms:
            heapq.heappush(self._expiries, (spec.expires_at_ms, trigger.serial, spec.trigger_id))
        self.stats["registered"] += 1
        return [_notice(NoticeKind.ARMED, spec, now_ms, 0, final=False, text=spec.describe())]

    def cancel(self, trigger_id: str, now_ms: int) -> list[Notice]:
        """Remove a trigger; CANCELLED if it was active (replayed cancels say nothing)."""
        trigger = self._drop(trigger_id)
        if trigger is None:
            return []
        self.stats["cancelled"] += 1
        spec = trigger.spec
        return [_notice(NoticeKind.CANCELLED, spec, now_ms, trigger.fire_count, True, "cancelled")]

    def _series_for(self, spec: TriggerSpec) -> Series:
        key = (spec.ticker, spec.period_seconds)
        series = self._series.get(key)
        if series is None:
            last = self._last_price.get(spec.ticker) if spec.period_seconds == 0 else None
            series = self._series[key] = Series(spec.ticker, spec.period_seconds, last)
            self._by_ticker.setdefault(spec.ticker, []).append(series)
            self._recent.setdefault(spec.ticker, RecentKeys(self.dedupe_capacity))
        return series

    def _drop(self, trigger_id: str) -> _Trigger | None:
        trigger = self._triggers.pop(trigger_id, None)
        if trigger is None:
            return None
        self._defs_version += 1
        spec = trigger.spec
        key = (spec.ticker, spec.period_seconds)
        series = self._series[key]
        for i, cond in enumerate(spec.conditions):
            series.remove(cond, (trigger_id, i))
        if series.members == 0:
            del self._series[key]
            remaining = [s for s in self._by_ticker[spec.ticker] if s is not series]
            if remaining:
                self._by_ticker[spec.ticker] = remaining
            else:
                del self._by_ticker[spec.ticker]
                self._recent.pop(spec.ticker, None)
        return trigger

    # --- evaluation ---------------------------------------------------------------

    def on_tick(
        self, ticker: str, trade_id: str, time_ms: int, price: float, amount: float, now_ms: int
    ) -> list[Notice]:
        """Evaluate one trade against every trigger on its ticker."""
        self.stats["ticks"] += 1
        watched = self._by_ticker.get(ticker)
        if not watched:
            self._last_price[ticker] = price
            return []
        if not self._recent[ticker].first_time(trade_id):
            self.stats["duplicates"] += 1
            return []
        self._last_price[ticker] = price
        notices: list[Notice] = []
        for series in list(watched):
            if series.candles is None:
                hits = series.point(time_ms, price, amount)
                self._resolve(series, hits, now_ms, notices, {})
            else:
                late = series.candles.late
                for candle in series.candles.add(time_ms, price, amount):
                    self._candle(series, candle, now_ms, notices)
                self.stats["late"] += series.candles.late - late
        return notices

    def advance(self, now_ms: int, owns: Callable[[str], bool] = _anyone) -> list[Notice]:
        """Processing time moved on: expire triggers, close idle candles.

        A due trigger on a ticker this engine does not own (`owns`: sharded engines,
        ADR 0014) stays: its owner expires it and tombstones it, and the tombstone
        cancels it here; if its ticker comes to this engine first, it expires here."""
        notices: list[Notice] = []
        due, self._overdue = self._overdue, []
        while self._expiries and self._expiries[0][0] <= now_ms:
            due.append(heapq.heappop(self._expiries))
        for entry in due:
            _, serial, trigger_id = entry
            trigger = self._triggers.get(trigger_id)
            if trigger is None or trigger.serial != serial:
                continue
            if owns(trigger.spec.ticker):
                notices.append(self._expire(trigger, now_ms))
            else:
                self._overdue.append(entry)
        for series in list(self._series.values()):
            if series.candles is not None:
                for candle in series.candles.flush(now_ms, self.candle_grace_ms):
                    self._candle(series, candle, now_ms, notices)
        return notices

    def _candle(
        self, series: Series, candle: ArrivalCandle, now_ms: int, notices: list[Notice]
    ) -> None:
        assert series.candles is not None
        close_time = series.candles.close_time(candle)
        hits = series.point(close_time, candle.close, candle.volume)
        extra = {"candle_open_time_ms": float(candle.open_time_ms)}
        self._resolve(series, hits, now_ms, notices, extra)

    def _resolve(
        self,
        series: Series,
        hits: Iterable[Hit],
        now_ms: int,
        notices: list[Notice],
        extra: dict[str, float],
    ) -> None:
        """Turn condition edges into fires. Second conditions go first, so a sequence
        never completes on the point that started it."""
        assert series.last_time is not None
        point_time = series.last_time
        for hit in sorted(hits, key=lambda h: -h.member[1]):
            trigger_id, index = hit.member
            trigger = self._triggers.get(trigger_id)
            if trigger is None:  # finished earlier on this very point
                continue
            spec = trigger.spec
            if spec.expires_at_ms and now_ms >= spec.expires_at_ms:
                notices.append(self._expire(trigger, now_ms))
                continue
            values = {**hit.values, "threshold": hit.threshold, **extra}
            if not spec.is_sequence:
                notices.append(self._fire(trigger, point_time, values))
                continue
            if index == 0:
                trigger.pending = _Pending(point_time, series.seq, values)
                continue
            pending = trigger.pending
            if pending is None:
                continue
            if point_time - pending.time_ms > spec.within_ms:
                trigger.pending = None  # too late: wait for a new first edge
                continue
            if pending.seq >= series.seq:
                continue
            trigger.pending = None
            first = {f"first_{key}": value for key, value in pending.values.items()}
            first["first_time_ms"] = float(pending.time_ms)
            notices.append(self._fire(trigger, point_time, {**first, **values}))

    def _fire(self, trigger: _Trigger, time_ms: int, values: dict[str, float]) -> Notice:
        spec = trigger.spec
        trigger.fire_count += 1
        self.stats["fired"] += 1
        final = not spec.repeating
        if final:
            self._drop(spec.trigger_id)
            self.retired.append(spec.trigger_id)
        return Notice(
            NoticeKind.FIRED,
            spec.trigger_id,
            spec.ticker,
            spec.topic,
            time_ms,
            trigger.fire_count,
            final,
            spec.describe(),
            values,
        )

    def _expire(self, trigger: _Trigger, now_ms: int) -> Notice:
        spec = trigger.spec
        self._drop(spec.trigger_id)
        self.retired.append(spec.trigger_id)
        self.stats["expired"] += 1
        return _notice(NoticeKind.EXPIRED, spec, now_ms, trigger.fire_count, True, "expired")

    # --- per-ticker state (follows the ticker's partition, ADR 0014) ---------------------

    def ticker_states(
        self, tickers: Iterable[str], *, recent: int = RECENT_SAVED
    ) -> dict[str, dict[str, Any]]:
        """The state of each of `tickers` that has any (JSON): last price, its newest
        `recent` trade ids, its series' windows and open candles, and its triggers' fire
        counts and pending sequences."""
        wanted = set(tickers)
        out: dict[str, dict[str, Any]] = {}
        for ticker in wanted:
            last = self._last_price.get(ticker)
            if last is None:
                continue
            d: dict[str, Any] = {"last_price": last, "series": [], "triggers": {}}
            d["series"] = [s.dump() for s in self._by_ticker.get(ticker, ())]
            seen = self._recent.get(ticker)
            d["recent"] = list(seen)[-recent:] if seen is not None else []
            out[ticker] = d
        for trigger_id, trigger in self._triggers.items():
            saved = out.get(trigger.spec.ticker)
            if saved is not None and (trigger.fire_count or trigger.pending is not None):
                p = trigger.pending
                pending = None if p is None else [p.time_ms, p.seq, p.values]
                saved["triggers"][trigger_id] = [trigger.fire_count, pending]
        return out

    def restore_tickers(self, states: dict[str, dict[str, Any]]) -> None:
        """What `ticker_states` saved (another engine's, or this one's earlier), over the
        state these tickers have here. Triggers and windows unknown here are skipped."""
        for ticker, d in states.items():
            self._last_price[ticker] = float(d["last_price"])
            for saved in d["series"]:
                series = self._series.get((ticker, int(saved["period"])))
                if series is not None:
                    series.load(saved)
            if ticker in self._recent:
                recent = self._recent[ticker] = RecentKeys(self.dedupe_capacity)
                for trade_id in d["recent"]:
                    recent.first_time(str(trade_id))
            for trigger_id, (fire_count, pending) in d["triggers"].items():
                trigger = self._triggers.get(trigger_id)
                if trigger is None or trigger.spec.ticker != ticker:
                    continue
                trigger.fire_count = int(fire_count)
                trigger.pending = None if pending is None else _Pending(*pending)

    def forget_tickers(self, which: Callable[[str], bool]) -> None:
        """Forget the points of every ticker `which` names (their state is restored
        from their partition's, or starts empty): windows, last price, trade ids and
        pending sequences; triggers stay."""
        for ticker in [t for t in self._last_price if which(t)]:
            del self._last_price[ticker]
        for ticker, watched in self._by_ticker.items():
            if not which(ticker):
                continue
            for series in watched:
                series.reset()
            self._recent[ticker] = RecentKeys(self.dedupe_capacity)
        for trigger in self._triggers.values():
            if trigger.pending is not None and which(trigger.spec.ticker):
                trigger.pending = None

    def drain_retired(self) -> list[str]:
        retired, self.retired = self.retired, []
        return retired


def _notice(
    kind: NoticeKind, spec: TriggerSpec, time_ms: int, fire_count: int, final: bool, text: str
) -> Notice:
    return Notice(kind, spec.trigger_id, spec.ticker, spec.topic, time_ms, fire_count, final, text)
