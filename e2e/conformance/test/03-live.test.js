"use strict";
// Live data on :5558 (docs/protocol.md "Topics", "Sequence numbers and recovery",
// "Live data", "Live feed status"): subscribing starts the feed; ticks and candles
// arrive on their exact topics with contiguous sequence numbers per topic.

const assert = require("node:assert/strict");
const { describe, test } = require("node:test");

const { config } = require("../lib/config");
const wire = require("../lib/wire");

const MIN_TICKS = 5;
const MIN_CANDLES = 2;
const TICK = `${config.ticker}|tick`;
const CANDLE = `${config.ticker}|ohlc:60`;
const STATUS = `${config.ticker}|status`;
const HOLD_MS = 8_000;

/**
 * Sequence check per topic as the docs state it: the first message is the
 * baseline; same epoch and last + 1 is in order, <= last a duplicate (dropped), >
 * last + 1 a gap; another epoch restarts the numbering.
 */
function contiguity(items) {
  const state = new Map();
  const gaps = [];
  let delivered = 0;
  for (const { topic, message } of items) {
    const seq = BigInt(message.sequence);
    const last = state.get(topic);
    if (last === undefined || last.epoch !== message.publisher_epoch) {
      state.set(topic, { epoch: message.publisher_epoch, seq });
      delivered++;
      continue;
    }
    if (seq <= last.seq) continue; // a duplicate (e.g. the last value re-sent)
    if (seq !== last.seq + 1n) gaps.push(`${topic}: ${last.seq} -> ${seq}`);
    last.seq = seq;
    delivered++;
  }
  return { gaps, delivered };
}

describe("live data", () => {
  test(`ticks and 1m candles of ${config.ticker}, contiguous per topic`, { timeout: config.liveTimeoutMs + 30_000 }, async () => {
    const sub = await wire.subscriber(STATUS, TICK, CANDLE);
    try {
      const enough = () => {
        const ticks = sub.received.filter((it) => it.topic === TICK).length;
        const candles = sub.received.filter((it) => it.topic === CANDLE).length;
        return ticks >= MIN_TICKS && candles >= MIN_CANDLES;
      };
      await sub.next(enough, config.liveTimeoutMs);
      assert.deepEqual(sub.errors, [], "every frame decodes");
      const ticks = sub.received.filter((it) => it.topic === TICK);
      const candles = sub.received.filter((it) => it.topic === CANDLE);
      const statuses = sub.received.filter((it) => it.topic === STATUS);
      const others = sub.received.filter((it) => ![TICK, CANDLE, STATUS].includes(it.topic));
      assert.ok(ticks.length >= MIN_TICKS, `${ticks.length} ticks within ${config.liveTimeoutMs} ms`);
      assert.ok(candles.length >= MIN_CANDLES, `${candles.length} candles within ${config.liveTimeoutMs} ms`);
      assert.deepEqual(others.map((it) => it.topic), [], "only the subscribed topics (prefix matches of these)");
      for (const it of ticks) {
        assert.equal(it.frames.length, 3);
        assert.equal(it.frames[2][0], 0x04, "type byte 0x04 = Tick");
        assert.equal(it.message.ticker, config.ticker);
        assert.ok(it.message.trade_id.length > 0);
        assert.ok(it.message.price > 0);
        assert.ok(BigInt(it.message.sequence) >= 1n);
        assert.notEqual(it.message.publisher_epoch, "0");
      }
      for (const it of candles) {
        assert.equal(it.frames[2][0], 0x05, "type byte 0x05 = OHLC");
        assert.equal(it.message.ticker, config.ticker);
        assert.equal(it.message.period_seconds, 60);
        assert.equal(BigInt(it.message.open_time_ms) % 60000n, 0n, "windows start on the minute");
        assert.ok(it.message.low <= it.message.high);
        assert.ok(BigInt(it.message.sequence) >= 1n);
      }
      for (const it of statuses) {
        assert.equal(it.frames[2][0], 0x14, "type byte 0x14 = FeedStatus");
        assert.notEqual(it.message.state, "FAILED", JSON.stringify(it.message));
      }
      const { gaps } = contiguity([...ticks, ...candles]);
      assert.deepEqual(gaps, [], "no sequence gaps");
    } finally {
      sub.close();
    }
  });

  test("STARTED/RECOVERED are never repeated to a subscriber that stays connected", { timeout: config.liveTimeoutMs + 30_000 }, async () => {
    // "Live feed status": only LOST/FAILED/REFUSED are repeated (every second); a held
    // STARTED is replayed only on a subscription edge, which this connection, answering
    // ZMTP PINGs, does not make. 8 s cover the relay's 1 s ping + 5 s timeout, after
    // which a client that does not answer would be dropped and see the replay.
    const sub = await wire.subscriber(STATUS, TICK);
    try {
      const first = await sub.next((it) => it.topic === TICK, config.liveTimeoutMs);
      assert.ok(first, "the feed runs");
      await new Promise((resolve) => setTimeout(resolve, HOLD_MS));
      assert.deepEqual(sub.errors, []);
      const seen = new Map();
      for (const it of sub.received.filter((x) => x.topic === STATUS)) {
        const { state, at_ms: atMs, ingestor_id: ingestor } = it.message;
        if (state !== "STARTED" && state !== "RECOVERED") continue;
        const key = `${state} ${atMs} ${ingestor}`;
        assert.ok(!seen.has(key), `${key} arrived twice, ${it.at - seen.get(key)} ms apart`);
        seen.set(key, it.at);
      }
    } finally {
      sub.close();
    }
  });

  test("a new subscription edge re-sends the last value to every subscriber; the sequence rule drops the copy", { timeout: config.liveTimeoutMs + 60_000 }, async () => {
    // "Expect duplicate last values": a prefix no one watched (`|tic`) is a first
    // subscription on the relay, so the pipeline answers it with the last tick, and
    // the copy reaches every subscriber whose prefix matches, this one on `|tick` too,
    // with the sequence number it was first sent with, byte for byte.
    const a = await wire.subscriber(TICK);
    let b = null;
    try {
      assert.ok(await a.next((it) => it.topic === TICK && it.message, config.liveTimeoutMs), "the feed runs");
      const from = a.received.length;
      b = await wire.subscriber(`${config.ticker}|tic`);
      const key = (it) => `${it.message.publisher_epoch}/${it.message.sequence}`;
      // The copy is the later of the two: the original may itself arrive after `from`
      // (a tick that came between the new subscription and the pipeline's re-send).
      const original = (it) =>
        a.received
          .slice(0, a.received.indexOf(it))
          .find((o) => o.topic === TICK && o.message && key(o) === key(it));
      const copy = await a.next((it) => it.topic === TICK && it.message && original(it) !== undefined, 30_000, from);
      assert.ok(copy, "no copy of a tick already received within 30 s of the new subscription");
      assert.ok(original(copy).frames[2].equals(copy.frames[2]), "the copy is the message as first sent");
      const lastValue = await b.next((it) => it.topic === TICK && it.message, 30_000);
      assert.ok(lastValue, "the new prefix got the last value");
      const { gaps, delivered } = contiguity(a.received.filter((it) => it.topic === TICK && it.message));
      assert.deepEqual(gaps, [], "no sequence gaps");
      assert.equal(delivered, new Set(a.received.filter((it) => it.topic === TICK && it.message).map(key)).size, "each tick delivered once after the rule");
    } finally {
      a.close();
      if (b) b.close();
    }
  });

  test("a period the pipeline does not serve live is REFUSED on {ticker}|status", { timeout: 60_000 }, async () => {
    const topic = `${config.ticker}|ohlc:900`;
    const sub = await wire.subscriber(STATUS, topic);
    try {
      const refused = await sub.next(
        (it) => it.topic === STATUS && it.message && it.message.state === "REFUSED" && it.message.period_seconds === 900,
        30_000,
      );
      assert.ok(refused, "no FeedStatus REFUSED within 30 s");
      assert.equal(refused.message.error_code, "unsupported_period");
      assert.equal(refused.message.ticker, config.ticker);
      assert.equal(refused.message.ingestor_id, "", "the relay decided");
      assert.ok(refused.message.reason.length > 0);
    } finally {
      sub.close();
    }
  });
});
