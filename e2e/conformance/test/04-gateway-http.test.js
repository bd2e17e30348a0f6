"use strict";
// The gateway's HTTP history (docs/protocol.md "Gateway", docs/gateway-messages.schema.json
// `history_response`, `http_error`): JSON with 64-bit integers as strings, Arrow and
// Parquet with their media types and report headers, and the documented 400s.

const assert = require("node:assert/strict");
const { describe, test } = require("node:test");

const { config } = require("../lib/config");
const { INT64, call } = require("../lib/http");

const MINUTE = 60_000;
const CANDLES = 20;
const ARROW = "application/vnd.apache.arrow.stream";
const PARQUET = "application/vnd.apache.parquet";
const REPORT_HEADERS = [
  "x-request-id", "x-status", "x-row-count", "x-expected-candles", "x-missing-candles",
  "x-exchange-gaps", "x-source",
];
const HISTORY_FIELDS = [
  "request_id", "status", "ticker", "period_seconds", "attempts", "elapsed_s", "snapshot_id",
  "integrity", "candles",
];
const OPTS = { timeout: config.historyTimeoutMs + 30_000 };

function range() {
  const aligned = Math.floor(Date.now() / MINUTE) * MINUTE;
  const start = aligned - (120 + Math.floor(Math.random() * 600)) * MINUTE;
  return { start, end: start + CANDLES * MINUTE };
}

function body(extra = {}) {
  const { start, end } = range();
  // start as a number, end as a decimal string: both documented.
  return { ticker: config.ticker, period: 60, start, end: String(end), ...extra };
}

function checkReportHeaders(answer) {
  for (const name of REPORT_HEADERS) assert.ok(answer.headers.get(name) !== null, `header ${name}`);
  assert.equal(answer.headers.get("x-status"), "OK");
  assert.equal(answer.headers.get("x-expected-candles"), String(CANDLES));
}

function checkArrow(answer) {
  assert.equal(answer.status, 200, answer.bytes.toString().slice(0, 300));
  assert.equal(answer.contentType.split(";")[0], ARROW);
  // An Arrow IPC stream starts with a message: continuation marker 0xFFFFFFFF.
  assert.equal(answer.bytes.subarray(0, 4).toString("hex"), "ffffffff");
  checkReportHeaders(answer);
}

describe("gateway HTTP history", () => {
  test("JSON answer: every documented field, 64-bit integers as strings", OPTS, async () => {
    const request = body();
    const answer = await call("POST", "/history", { body: request });
    assert.equal(answer.status, 200, answer.bytes.toString().slice(0, 300));
    assert.equal(answer.contentType.split(";")[0], "application/json");
    const h = answer.json;
    assert.deepEqual(Object.keys(h).sort(), [...HISTORY_FIELDS].sort());
    assert.equal(h.status, "OK");
    assert.equal(h.ticker, config.ticker);
    assert.equal(h.period_seconds, 60);
    assert.equal(typeof h.attempts, "number");
    assert.equal(typeof h.elapsed_s, "number");
    assert.match(h.snapshot_id, INT64, "snapshot_id is a decimal string");
    assert.deepEqual(Object.keys(h.integrity).sort(),
      ["exchange_gaps", "expected_candles", "missing_candles", "row_count", "source"]);
    for (const key of ["exchange_gaps", "expected_candles", "missing_candles", "row_count"]) {
      assert.match(h.integrity[key], INT64, `integrity.${key} is a decimal string`);
    }
    assert.equal(h.integrity.expected_candles, String(CANDLES));
    assert.equal(Number(h.integrity.row_count), h.candles.length);
    assert.ok(h.candles.length > 0);
    let previous = -1n;
    for (const c of h.candles) {
      assert.deepEqual(Object.keys(c).sort(),
        ["close", "high", "low", "open", "open_time_ms", "trade_count", "volume"]);
      assert.match(c.open_time_ms, INT64);
      assert.ok(c.trade_count === null || INT64.test(c.trade_count), "trade_count: string or null");
      const t = BigInt(c.open_time_ms);
      assert.ok(t >= BigInt(request.start) && t < BigInt(request.end), "inside [start, end)");
      assert.equal(t % 60000n, 0n);
      assert.ok(t > previous, "sorted by open time");
      previous = t;
    }
    // The /status of the same request names the same snapshot, exactly.
    const status = await call("GET", `/status/${h.request_id}`);
    assert.equal(status.json.state, "OK");
    assert.equal(status.json.notification.snapshot_id, h.snapshot_id);
    // The gateway received this notification itself: /status carries its stamps.
    assert.match(status.json.notification.sequence, INT64);
    assert.match(status.json.notification.publisher_epoch, INT64);
  });

  test("format=arrow as a query parameter: Arrow IPC stream", OPTS, async () => {
    checkArrow(await call("POST", "/history?format=arrow", { body: body() }));
  });

  test("format as a body field", OPTS, async () => {
    checkArrow(await call("POST", "/history", { body: body({ format: "arrow" }) }));
  });

  test("Accept: Parquet", OPTS, async () => {
    const answer = await call("POST", "/history", { body: body(), accept: PARQUET });
    assert.equal(answer.status, 200, answer.bytes.toString().slice(0, 300));
    assert.equal(answer.contentType.split(";")[0], PARQUET);
    assert.equal(answer.bytes.subarray(0, 4).toString(), "PAR1");
    assert.equal(answer.bytes.subarray(-4).toString(), "PAR1");
    checkReportHeaders(answer);
  });

  test("400 bad_format for an unknown format", async () => {
    const answer = await call("POST", "/history?format=xml", { body: body() });
    assert.equal(answer.status, 400);
    assert.equal(answer.json.error_code, "bad_format");
  });

  test("400 bad_request for a body that is not a JSON object", async () => {
    const answer = await call("POST", "/history", { body: "[1, 2]" });
    assert.equal(answer.status, 400);
    assert.equal(answer.json.error_code, "bad_request");
    assert.equal(typeof answer.json.reason, "string");
  });

  test("400 bad_request for an unknown field", async () => {
    const answer = await call("POST", "/history", { body: body({ colour: "red" }) });
    assert.equal(answer.status, 400);
    assert.equal(answer.json.error_code, "bad_request");
  });

  test("400 with the rule's code for a malformed ticker", async () => {
    const answer = await call("POST", "/history", { body: body({ ticker: "BTCUSDT" }) });
    assert.equal(answer.status, 400);
    assert.equal(answer.json.error_code, "bad_ticker");
  });
});
