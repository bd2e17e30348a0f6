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
const PIPELINE_STATUS = "PIPELINE:status";
const SOURCES = ["SOURCE_EXCHANGE", "SOURCE_STORAGE", "SOURCE_STORAGE_AND_EXCHANGE", "SOURCE_TRADES"];

/** A closed, minute-aligned range of CANDLES one-minute candles, a few hours back. */
function pastRange() {
  const aligned = Math.floor(Date.now() / MINUTE) * MINUTE;
  const start = aligned - (180 + Math.floor(Math.random() * 600)) * MINUTE;
  return { start, end: start + CANDLES * MINUTE };
}

/**
 * A down word to believe: false while a serving word on the same topic came within two
 * of its intervals (with active/active relays, another relay still hears the part).
 * `serving(message)` reads the word. Returns a predicate for Inbox.next.
 */
function downUnlessServing(topic, name, serving) {
  let servingUntil = -Infinity;
  return (it) => {
    if (it.topic !== topic || it.name !== name) return false;
    if (serving(it.message)) {
      servingUntil = it.at + 2 * (Number(it.message.interval_ms) || 1000);
      return false;
    }
    return it.at > servingUntil;
  };
}

/**
 * docs/protocol.md "Pipeline liveness": while a request is in flight, a PipelineStatus
 * on PIPELINE:status with `history` false (the relay's down report once the heartbeat
 * is overdue, or the pipeline's own word) means it will not be answered; so does an
 * ExchangeServing on INGESTORS:{exchange}|status with `served` false ("Ingestor
 * liveness": no live ingestor of the request's exchange is left to take it over).
 */
function downWords(servingTopic) {
  const pipeline = downUnlessServing(PIPELINE_STATUS, "PipelineStatus", (m) => m.history);
  const ingestors = downUnlessServing(servingTopic, "ExchangeServing", (m) => m.served);
  return (it) => pipeline(it) || ingestors(it);
}

/** Where relays say whether a live ingestor serves a ticker's exchange. */
function ingestorsTopic(ticker) {
  return `INGESTORS:${ticker.split(":")[0]}|status`;
}

/** Subscribe first (the notification topic, PIPELINE:status and the exchange's
 * INGESTORS:{exchange}|status), submit, wait for the notification on exactly that
 * topic, or fail at once with pipeline_unavailable or no_ingestor. */
async function historyRound({ notify, clientId = "" }) {
  const requestId = wire.newId("conf-hist");
  const topic = notify === PER_CLIENT ? `RESPONSE:${clientId}` : `HISTORY_READY:${requestId}`;
  const { start, end } = pastRange();
  const servingTopic = ingestorsTopic(config.ticker);
  const sub = await wire.subscriber(topic, PIPELINE_STATUS, servingTopic);
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
    const down = downWords(servingTopic);
    const item = await sub.next(
      (it) =>
        down(it) ||
        (it.topic === topic && it.name === "HistoryReadyNotification" && it.message.request_id === requestId),
      config.historyTimeoutMs,
    );
    assert.ok(item, `no HistoryReadyNotification on ${topic} within ${config.historyTimeoutMs} ms`);
    assert.notEqual(item.name, "PipelineStatus", `pipeline_unavailable: ${item.message?.reason}`);
    assert.notEqual(item.name, "ExchangeServing", `no_ingestor: ${item.message?.reason}`);
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

  test("gateway GET /status: an id the platform never saw is UNKNOWN", async () => {
    const id = wire.newId("conf-none");
    const answer = await call("GET", `/status/${id}`);
    assert.equal(answer.status, 200, answer.bytes.toString());
    assert.deepEqual(answer.json, { request_id: id, state: "UNKNOWN", notification: null });
  });

  test("gateway GET /status: an accepted request is PENDING until its outcome, never UNKNOWN", { timeout: config.historyTimeoutMs + 30_000 }, async () => {
    // "Request status": the relay that acknowledged the submit remembers it.
    const requestId = wire.newId("conf-pending");
    const topic = `HISTORY_READY:${requestId}`;
    const { start, end } = pastRange();
    const sub = await wire.subscriber(topic);
    try {
      const { message: ack } = await wire.request("SubmitHistoricalRequest", {
        request_id: requestId, ticker: config.ticker, period_seconds: 60,
        start_time_ms: start, end_time_ms: end, notify: PER_REQUEST,
      });
      assert.equal(ack.status, "OK", JSON.stringify(ack));
      const early = await call("GET", `/status/${requestId}`);
      assert.equal(early.status, 200, early.bytes.toString());
      // PENDING, or already answered (a range stored before is answered in about a second).
      assert.notEqual(early.json.state, "UNKNOWN", JSON.stringify(early.json));
      const note = await sub.next((it) => it.topic === topic && it.name === "HistoryReadyNotification", config.historyTimeoutMs);
      assert.ok(note, `no notification on ${topic}`);
      // An answer from storage is notified a micro-batch before its row: PENDING until then.
      let done;
      for (const deadline = Date.now() + 60_000; ; ) {
        done = await call("GET", `/status/${requestId}`);
        assert.notEqual(done.json.state, "UNKNOWN", JSON.stringify(done.json));
        if (done.json.state !== "PENDING" || Date.now() > deadline) break;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      assert.equal(done.json.state, note.message.status, "once recorded: the notification's outcome");
    } finally {
      sub.close();
    }
  });
});

describe("request status on :5559 (RequestStatusQuery)", () => {
  test("an id this relay accepted: OK with the ack's topic; one it never saw: NOT_FOUND", async () => {
    const requestId = wire.newId("conf-query");
    const { start, end } = pastRange();
    const submittedAt = Date.now();
    const { message: ack } = await wire.request("SubmitHistoricalRequest", {
      request_id: requestId, ticker: config.ticker, period_seconds: 60,
      start_time_ms: start, end_time_ms: end, notify: PER_REQUEST,
    });
    assert.equal(ack.status, "OK", JSON.stringify(ack));
    const known = await wire.request("RequestStatusQuery", { request_id: requestId });
    assert.equal(known.name, "RequestStatusReply", "a status query is answered in its own type");
    assert.equal(known.typeId, 0x19);
    assert.equal(known.message.request_id, requestId);
    assert.equal(known.message.status, "OK", JSON.stringify(known.message));
    assert.equal(known.message.notification_topic, ack.notification_topic);
    const acceptedAt = Number(known.message.accepted_at_ms);
    assert.ok(acceptedAt >= submittedAt - 5 * MINUTE && acceptedAt <= Date.now() + 5 * MINUTE,
      `accepted_at_ms ${acceptedAt} is the relay's wall clock at its ack`);
    assert.ok(known.message.remembered_s > 0, "the relay says how long it remembers ids");
    const never = await wire.request("RequestStatusQuery", { request_id: wire.newId("conf-never") });
    assert.equal(never.message.status, "NOT_FOUND", JSON.stringify(never.message));
    assert.equal(never.message.accepted_at_ms, "0");
    assert.ok(never.message.reason.length > 0);
  });

  test("an id no submit could carry: REJECTED bad_id / missing_id", async () => {
    for (const [id, code] of [["bad id!", "bad_id"], ["", "missing_id"]]) {
      const { name, message } = await wire.request("RequestStatusQuery", { request_id: id });
      assert.equal(name, "RequestStatusReply");
      assert.equal(message.status, "REJECTED", JSON.stringify(message));
      assert.equal(message.error_code, code);
    }
  });
});
