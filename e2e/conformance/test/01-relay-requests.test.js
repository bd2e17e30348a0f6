"use strict";
// The relay's ROUTER :5559: envelope framing, type bytes, and every documented
// refusal that needs no data (docs/protocol.md "Envelope", "Relay replies (:5559)").

const assert = require("node:assert/strict");
const { describe, test } = require("node:test");

const { config } = require("../lib/config");
const wire = require("../lib/wire");

const NOW = Date.now();
const HOUR = 3600_000;
const PER_CLIENT = 1;
const PER_REQUEST = 2;

function submit(overrides) {
  return {
    request_id: wire.newId("conf-rej"),
    client_id: "",
    ticker: config.ticker,
    period_seconds: 60,
    start_time_ms: NOW - 2 * HOUR,
    end_time_ms: NOW - HOUR,
    notify: PER_REQUEST,
    ...overrides,
  };
}

async function rejected(fields, errorCode) {
  const { name, message } = await wire.request("SubmitHistoricalRequest", submit(fields));
  assert.equal(name, "SubmitResponse", "a submit is answered with a SubmitResponse");
  assert.equal(message.status, "REJECTED", JSON.stringify(message));
  assert.equal(message.error_code, errorCode, JSON.stringify(message));
  assert.ok(message.reason.length > 0, "a refusal says why");
  assert.equal(message.notification_topic, "");
  return message;
}

/** Raw body frames after the delimiter -> the relay's Response (the generic error reply). */
async function genericError(bodyFrames, errorCode) {
  const reply = await wire.exchange(bodyFrames);
  assert.equal(reply.length, 3, "reply is [empty][version][type+payload]");
  assert.equal(reply[0].length, 0);
  assert.deepEqual([...reply[1]], [0x01]);
  assert.equal(reply[2][0], 0x08, "the generic error reply is Response (type 0x08)");
  const { message } = wire.decodeEnvelope(reply.slice(1));
  assert.equal(message.status, "ERROR", JSON.stringify(message));
  assert.equal(message.error_code, errorCode, JSON.stringify(message));
  return message;
}

describe("envelope framing on :5559", () => {
  test("a REQ-style request (empty delimiter) is answered [empty][0x01][0x11 payload]", async () => {
    const id = wire.newId("conf-frame");
    // period 0 is refused by rule, so the check causes no work on the platform.
    const reply = await wire.exchange(wire.envelope("SubmitHistoricalRequest", submit({ request_id: id, period_seconds: 0 })));
    assert.equal(reply.length, 3);
    assert.equal(reply[0].length, 0, "the delimiter comes back");
    assert.deepEqual([...reply[1]], [0x01], "frame: protocol version 0x01");
    assert.equal(reply[2][0], 0x11, "type byte 0x11 = SubmitResponse");
    const { message } = wire.decodeEnvelope(reply.slice(1));
    assert.equal(message.request_id, id, "the reply echoes request_id");
  });

  test("a DEALER without a delimiter gets the reply without one", async () => {
    const frames = wire.envelope("SubmitHistoricalRequest", submit({ period_seconds: 0 }));
    const reply = await wire.exchange(frames, { delimiter: false });
    assert.equal(reply.length, 2, "reply is [version][type+payload]");
    assert.deepEqual([...reply[0]], [0x01]);
    assert.equal(reply[1][0], 0x11);
  });

  test("the byte-by-byte examples of docs/client-guide.md", () => {
    // "Frames byte by byte": the submit, and the three replies.
    const [version, data] = wire.envelope("SubmitHistoricalRequest", {
      request_id: "r1",
      client_id: "c1",
      ticker: "BINANCE:BTC/USDT",
      period_seconds: 60,
      start_time_ms: 1795132800000,
      end_time_ms: 1795136400000,
      notify: PER_REQUEST,
    });
    assert.equal(version.toString("hex"), "01");
    const ticker = Buffer.from("BINANCE:BTC/USDT").toString("hex");
    assert.equal(
      data.toString("hex"),
      `10 0a027231 12026331 1a10${ticker} 203c 2880f882b29f34 3080d5deb39f34 3802`.replace(/ /g, ""),
    );
    const hex = (s) => Buffer.from(s).toString("hex");
    const replies = [
      [`11 0a027231 1001 2a10${hex("HISTORY_READY:r1")}`, "SubmitResponse",
        { request_id: "r1", status: "OK", notification_topic: "HISTORY_READY:r1" }],
      [`11 0a027231 1004 1a1a${hex("period_seconds must be > 0")} 220a${hex("bad_period")}`, "SubmitResponse",
        { request_id: "r1", status: "REJECTED", error_code: "bad_period" }],
      [`08 1003 1a19${hex("unknown message type 0x7F")} 220c${hex("unknown_type")}`, "Response",
        { status: "ERROR", error_code: "unknown_type", request_id: "" }],
    ];
    for (const [bytes, name, fields] of replies) {
      const decoded = wire.decodeEnvelope([Buffer.from([1]), Buffer.from(bytes.replace(/ /g, ""), "hex")]);
      assert.equal(decoded.name, name);
      for (const [key, value] of Object.entries(fields)) assert.equal(decoded.message[key], value, key);
    }
  });
});

describe("refusals: typed replies (SubmitResponse REJECTED)", () => {
  test("bad_ticker", () => rejected({ ticker: "BTCUSDT" }, "bad_ticker"));
  test("bad_period: period_seconds 0", () => rejected({ period_seconds: 0 }, "bad_period"));
  test("bad_time_range: start after end", () =>
    rejected({ start_time_ms: NOW - HOUR, end_time_ms: NOW - 2 * HOUR }, "bad_time_range"));
  test("bad_time_range: empty range", () =>
    rejected({ start_time_ms: NOW - HOUR, end_time_ms: NOW - HOUR }, "bad_time_range"));
  test("bad_time_range: end more than a day ahead", () =>
    rejected({ end_time_ms: NOW + 2 * 24 * HOUR }, "bad_time_range"));
  test("range_too_large: more than 10,000,000 candles", () =>
    rejected({ period_seconds: 1, start_time_ms: 0, end_time_ms: NOW - HOUR }, "range_too_large"));
  test("missing_id: neither request_id nor client_id", () =>
    rejected({ request_id: "", client_id: "" }, "missing_id"));
  test("bad_id: an id outside [A-Za-z0-9_.-]{1,128}", async () => {
    const message = await rejected({ request_id: "bad id!" }, "bad_id");
    assert.equal(message.request_id, "bad id!", "the refused request_id is echoed");
  });
  test("bad_notify: PER_CLIENT without client_id", () =>
    rejected({ notify: PER_CLIENT, client_id: "" }, "bad_notify"));
  test("bad_notify: an unknown pattern", () => rejected({ notify: 7 }, "bad_notify"));
  test("CEP: bad_condition answered as a CEPTriggerAck", async () => {
    const id = wire.newId("conf-trig");
    const { name, message } = await wire.request("CEPTriggerRequest", {
      trigger_id: id,
      action: wire.enumValue("CEPTriggerRequest.Action", "REGISTER"),
      ticker: config.ticker,
      conditions: [],
    });
    assert.equal(name, "CEPTriggerAck");
    assert.equal(message.status, "REJECTED");
    assert.equal(message.error_code, "bad_condition");
    assert.equal(message.trigger_id, id);
  });
  test("CEP: bad_action answered as a CEPTriggerAck", async () => {
    const { name, message } = await wire.request("CEPTriggerRequest", {
      trigger_id: wire.newId("conf-trig"),
      action: 0,
    });
    assert.equal(name, "CEPTriggerAck");
    assert.equal(message.status, "REJECTED");
    assert.equal(message.error_code, "bad_action");
  });
});

describe("refusals: generic Response{ERROR} for what cannot be decoded", () => {
  const v1 = Buffer.from([0x01]);
  test("unknown_type: type byte 0x7F", () => genericError([v1, Buffer.from([0x7f, 0x0a, 0x00])], "unknown_type"));
  test("bad_version: version 0x02", () =>
    genericError([Buffer.from([0x02]), wire.body("SubmitHistoricalRequest", submit({}))], "bad_version"));
  test("frame_count: three envelope frames", () =>
    genericError([v1, wire.body("SubmitHistoricalRequest", submit({})), Buffer.from("x")], "frame_count"));
  test("frame_count: the version frame alone", () => genericError([v1], "frame_count"));
  test("empty_frame: an empty message frame", () => genericError([v1, Buffer.alloc(0)], "empty_frame"));
  test("bad_payload: a payload that is not protobuf", () =>
    // 0x10 then field 1 (length-delimited) claiming 5 bytes, with 1 present.
    genericError([v1, Buffer.from([0x10, 0x0a, 0x05, 0x61])], "bad_payload"));
  test("too_large: a payload above 64 KiB", () =>
    genericError([v1, Buffer.concat([Buffer.from([0x10]), Buffer.alloc(70 * 1024)])], "too_large"));
  test("unexpected_type: a valid Tick sent as a request", () =>
    genericError(wire.envelope("Tick", { ticker: config.ticker, trade_id: "1", price: 1 }), "unexpected_type"));
});
