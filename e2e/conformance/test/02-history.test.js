"use strict";
// The historical request flow in both notification patterns (docs/protocol.md
// "Historical request flow", "Topics", "Sequence numbers and recovery"), and the
// gateway's GET /status for the same request ("Gateway": the notification as
// published, 64-bit integers as exact decimal strings).

const assert = require("node:assert/strict");
const { describe, test } = require("node:test");

const { config } = require("../lib/config");
const { INT64, call } = require("../lib/http");
const wire = require("../lib/wire");

const MINUTE = 60_000;
const CANDLES = 30;
const PER_CLIENT = 1;
const PER_REQUEST = 2;
const SOURCES = ["SOURCE_EXCHANGE", "SOURCE_STORAGE", "SOURCE_STORAGE_AND_EXCHANGE"];

/** A closed, minute-aligned range of CANDLES one-minute candles, a few hours back. */
function pastRange() {
  const aligned = Math.floor(Date.now() / MINUTE) * MINUTE;
  const start = aligned - (180 + Math.floor(Math.random() * 600)) * MINUTE;
  return { start, end: start + CANDLES * MINUTE };
}

/** Subscribe first, submit, wait for the notification on exactly that topic. */
async function historyRound({ notify, clientId = "" }) {
  const requestId = wire.newId("conf-hist");
  const topic = notify === PER_CLIENT ? `RESPONSE:${clientId}` : `HISTORY_READY:${requestId}`;
  const { start, end } = pastRange();
  const sub = await wire.subscriber(topic);
  try {
    const submittedAt = Date.now();
    const { name, message: ack } = await wire.request("SubmitHistoricalRequest", {
      request_id: requestId,
      client_id: clientId,
      ticker: config.ticker,
      period_seconds: 60,
      start_time_ms: start,
      end_time_ms: end,
      notify,
    });
    assert.equal(name, "SubmitResponse");
    assert.equal(ack.status, "OK", `submit refused: ${JSON.stringify(ack)}`);
    assert.equal(ack.request_id, requestId);
    assert.equal(ack.notification_topic, topic, "the ack names the topic the client subscribed to");
    const item = await sub.next(
      (it) => it.topic === topic && it.name === "HistoryReadyNotification" && it.message.request_id === requestId,
      config.historyTimeoutMs,
    );
    assert.ok(item, `no HistoryReadyNotification on ${topic} within ${config.historyTimeoutMs} ms`);
    return { item, requestId, clientId, topic, start, end, submittedAt };
  } finally {
    sub.close();
  }
}

function checkNotification({ item, requestId, clientId, start, end, submittedAt }) {
  assert.equal(item.frames.length, 3, "SUB frames: [topic][version][type+payload]");
  assert.deepEqual([...item.frames[1]], [0x01]);
  assert.equal(item.frames[2][0], 0x12, "type byte 0x12 = HistoryReadyNotification");
  const n = item.message;
  assert.equal(n.request_id, requestId);
  assert.equal(n.client_id, clientId);
  assert.equal(n.status, "OK", JSON.stringify(n));
  assert.equal(n.ticker, config.ticker);
  assert.equal(n.period_seconds, 60);
  assert.equal(n.start_time_ms, String(start));
  assert.equal(n.end_time_ms, String(end));
  assert.match(n.iceberg_table, /^[a-z_]+\.[a-z_]+$/, "iceberg_table names namespace.table");
  assert.match(n.snapshot_id, INT64);
  assert.notEqual(n.snapshot_id, "0", "an OK answer names the snapshot holding its rows");
  const completed = Number(n.completed_at_ms);
  assert.ok(completed >= submittedAt - 5 * MINUTE && completed <= Date.now() + 5 * MINUTE,
    `completed_at_ms ${completed} is the pipeline's wall clock at completion`);
  assert.equal(n.expected_candles, String(CANDLES), "closed slots in [start, end)");
  const rows = BigInt(n.row_count);
  const gaps = BigInt(n.exchange_gaps);
  const missing = BigInt(n.missing_candles);
  assert.ok(rows > 0n, "an OK answer has rows");
  assert.equal(rows + gaps + missing, BigInt(CANDLES), "missing = expected - rows - exchange_gaps");
  assert.ok(SOURCES.includes(n.source), `source ${n.source}`);
  assert.ok(BigInt(n.sequence) >= 1n, "published notifications are sequenced from 1");
  assert.notEqual(n.publisher_epoch, "0", "publisher_epoch is set");
}

describe("history: subscribe first, submit, notification", () => {
  let perRequest;

  test("NOTIFY_PER_REQUEST: HISTORY_READY:{request_id}", { timeout: config.historyTimeoutMs + 30_000 }, async () => {
    perRequest = await historyRound({ notify: PER_REQUEST });
    checkNotification(perRequest);
  });

  test("NOTIFY_PER_CLIENT: RESPONSE:{client_id}", { timeout: config.historyTimeoutMs + 30_000 }, async () => {
    const round = await historyRound({ notify: PER_CLIENT, clientId: wire.newId("conf-client") });
    checkNotification(round);
  });

  /** A NOTIFY_AUTO submit (the default) of a past range: its ack. */
  async function submitAuto(ids) {
    const { start, end } = pastRange();
    const { message: ack } = await wire.request("SubmitHistoricalRequest", {
      ...ids,
      ticker: config.ticker,
      period_seconds: 60,
      start_time_ms: start,
      end_time_ms: end,
    });
    assert.equal(ack.status, "OK", JSON.stringify(ack));
    return ack;
  }

  test("NOTIFY_AUTO without request_id: the relay generates a 32-hex id", async () => {
    const clientId = wire.newId("conf-auto");
    const ack = await submitAuto({ client_id: clientId });
    assert.match(ack.request_id, /^[0-9a-f]{32}$/);
    assert.equal(ack.notification_topic, `RESPONSE:${clientId}`);
  });

  test("NOTIFY_AUTO without client_id: HISTORY_READY:{request_id}", async () => {
    const requestId = wire.newId("conf-auto");
    const ack = await submitAuto({ request_id: requestId });
    assert.equal(ack.notification_topic, `HISTORY_READY:${requestId}`);
  });

  test("an exchange no ingestor serves: REJECTED no_ingestor (or unknown_exchange)", async () => {
    const { start, end } = pastRange();
    const { message: ack } = await wire.request("SubmitHistoricalRequest", {
      request_id: wire.newId("conf-unserved"),
      ticker: "NOWHERE:BTC/USDT",
      period_seconds: 60,
      start_time_ms: start,
      end_time_ms: end,
      notify: PER_REQUEST,
    });
    assert.equal(ack.status, "REJECTED", JSON.stringify(ack));
    // Which of the two depends on the relay's known_exchanges, which clients cannot see.
    assert.ok(["no_ingestor", "unknown_exchange"].includes(ack.error_code), JSON.stringify(ack));
  });

  test("an unknown symbol: REJECTED bad_symbol, or an ERROR notification bad_symbol", { timeout: config.historyTimeoutMs + 30_000 }, async () => {
    // The relay refuses it at once when it has the exchange's market metadata;
    // otherwise the ingestor's fetch ends with an ERROR notification.
    const requestId = wire.newId("conf-nosym");
    const topic = `HISTORY_READY:${requestId}`;
    const base = config.ticker.split(":")[0];
    const { start, end } = pastRange();
    const sub = await wire.subscriber(topic);
    try {
      const { message: ack } = await wire.request("SubmitHistoricalRequest", {
        request_id: requestId,
        ticker: `${base}:NOSUCHCOIN/USDT`,
        period_seconds: 60,
        start_time_ms: start,
        end_time_ms: end,
        notify: PER_REQUEST,
      });
      if (ack.status === "REJECTED") {
        assert.equal(ack.error_code, "bad_symbol", JSON.stringify(ack));
        return;
      }
      assert.equal(ack.status, "OK", JSON.stringify(ack));
      const item = await sub.next((it) => it.topic === topic && it.message && it.message.request_id === requestId, config.historyTimeoutMs);
      assert.ok(item, `no notification on ${topic}`);
      assert.equal(item.message.status, "ERROR", JSON.stringify(item.message));
      assert.equal(item.message.error_code, "bad_symbol");
      assert.equal(item.message.snapshot_id, "0", "ERROR carries snapshot_id 0");
    } finally {
      sub.close();
    }
  });

  test("gateway GET /status: the notification as published, exact 64-bit strings", async (t) => {
    if (!perRequest) return t.skip("needs the NOTIFY_PER_REQUEST round");
    const published = perRequest.item.message;
    const answer = await call("GET", `/status/${perRequest.requestId}`);
    assert.equal(answer.status, 200, answer.bytes.toString());
    assert.equal(answer.json.request_id, perRequest.requestId);
    assert.equal(answer.json.state, "OK");
    const recorded = answer.json.notification;
    assert.deepEqual(Object.keys(recorded).sort(), Object.keys(published).sort(), "every field");
    for (const [key, value] of Object.entries(published)) {
      if (key === "sequence" || key === "publisher_epoch") {
        // Submitted over ZeroMQ: the gateway did not receive this publication, and
        // market.requests does not record its stamps.
        assert.equal(recorded[key], null, `${key}: null in /status (not received by the gateway)`);
      } else {
        assert.deepEqual(recorded[key], value, `${key} as published`);
      }
    }
    // The raw text carries the id as a string: a JSON number would lose digits above 2^53.
    assert.ok(answer.bytes.toString().includes(`"snapshot_id": "${published.snapshot_id}"`) ||
      answer.bytes.toString().includes(`"snapshot_id":"${published.snapshot_id}"`));
  });

  test("gateway GET /status: an id that can never exist is 400 bad_id", async () => {
    const answer = await call("GET", `/status/${encodeURIComponent("bad id!")}`);
    assert.equal(answer.status, 400);
    assert.equal(answer.json.error_code, "bad_id");
    assert.equal(typeof answer.json.reason, "string");
  });

  test("gateway GET /status: an unknown well-formed id is PENDING", async () => {
    const id = wire.newId("conf-none");
    const answer = await call("GET", `/status/${id}`);
    assert.equal(answer.status, 200);
    assert.deepEqual(answer.json, { request_id: id, state: "PENDING", notification: null });
  });
});
