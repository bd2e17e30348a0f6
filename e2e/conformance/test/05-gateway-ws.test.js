"use strict";
// The gateway's WebSocket /ws (docs/protocol.md "Gateway", the schema's `client_op`
// and `server_frame`): exact topics, refusals that name their topic, live messages
// with 64-bit integers as strings.

const assert = require("node:assert/strict");
const { after, before, describe, test } = require("node:test");
const WebSocket = require("ws");

const { config } = require("../lib/config");
const { INT64, wsUrl } = require("../lib/http");
const { Inbox } = require("../lib/inbox");

const TICK = `${config.ticker}|tick`;

class Session {
  constructor(ws) {
    this.ws = ws;
    this.inbox = new Inbox();
    this.frames = this.inbox.items;
    ws.on("message", (data, isBinary) => {
      this.inbox.push(isBinary ? { binary: true } : JSON.parse(data.toString("utf8")));
    });
  }

  static open() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(wsUrl());
      const session = new Session(ws);
      ws.once("open", () => resolve(session));
      ws.once("error", reject);
    });
  }

  send(frame) {
    this.ws.send(typeof frame === "string" ? frame : JSON.stringify(frame));
  }

  /** The first frame (from index `from`) that `want` accepts, or a failure naming the last ones. */
  async next(want, timeoutMs, from = 0) {
    const frame = await this.inbox.next(want, timeoutMs, from);
    if (frame === null) {
      assert.fail(`no matching frame within ${timeoutMs} ms; last: ${JSON.stringify(this.frames.slice(-3))}`);
    }
    return frame;
  }

  close() {
    this.ws.close();
  }
}

const isError = (topic) => (f) => f.type === "error" && f.topic === topic;

describe("gateway WebSocket", () => {
  let s;
  before(async () => {
    s = await Session.open();
  });
  after(() => s && s.close());

  test("a prefix is refused bad_topic, naming the topic as sent", async () => {
    s.send({ op: "subscribe", topic: "BINANCE:" });
    const error = await s.next(isError("BINANCE:"), 10_000);
    assert.equal(error.error_code, "bad_topic");
    assert.deepEqual(Object.keys(error).sort(), ["error_code", "reason", "topic", "type"]);
  });

  test("a topic that is not a string is bad_topic with topic null (no value echoed)", async () => {
    for (const topic of [42, null, { name: "BINANCE:BTC/USDT|tick" }]) {
      const from = s.frames.length;
      s.send({ op: "subscribe", topic });
      const error = await s.next((f) => f.type === "error", 10_000, from);
      assert.equal(error.error_code, "bad_topic", JSON.stringify(error));
      assert.equal(error.topic, null, `topic ${JSON.stringify(topic)} comes back null`);
    }
  });

  test("a frame without topic is bad_request with topic null", async () => {
    const from = s.frames.length;
    s.send({ op: "subscribe" });
    const error = await s.next((f) => f.type === "error", 10_000, from);
    assert.equal(error.error_code, "bad_request");
    assert.equal(error.topic, null);
  });

  test("an unknown op is bad_request naming its topic", async () => {
    s.send({ op: "watch", topic: TICK });
    const error = await s.next((f) => f.type === "error" && f.error_code === "bad_request" && f.topic === TICK, 10_000);
    assert.ok(error.reason.length > 0);
  });

  test("text that is not JSON is bad_request with topic null", async () => {
    const from = s.frames.length;
    s.send("not json");
    const error = await s.next((f) => f.type === "error", 10_000, from);
    assert.equal(error.error_code, "bad_request");
    assert.equal(error.topic, null);
  });

  test("an unsupported candle period ends the subscription: unsupported_period", { timeout: 60_000 }, async () => {
    const topic = `${config.ticker}|ohlc:900`;
    s.send({ op: "subscribe", topic });
    const error = await s.next(isError(topic), 30_000);
    assert.equal(error.error_code, "unsupported_period");
  });

  test("a ticker the exchange does not list: the feed FAILED, error bad_symbol", { timeout: 90_000 }, async () => {
    const topic = `${config.ticker.split(":")[0]}:NOSUCHCOIN/USDT|tick`;
    s.send({ op: "subscribe", topic });
    const error = await s.next(isError(topic), 60_000);
    assert.equal(error.error_code, "bad_symbol");
  });

  test("book ladders name the tick and lot size; prices sit on that grid", { timeout: config.liveTimeoutMs + 30_000 }, async () => {
    const topic = `${config.ticker}|book`;
    const from = s.frames.length;
    s.send({ op: "subscribe", topic });
    const ladder = await s.next((f) => f.type === "book" && f.topic === topic && f.bids.length > 0, config.liveTimeoutMs, from);
    for (const key of ["price_decimals", "amount_decimals"]) {
      const value = ladder[key];
      assert.ok(value === null || (Number.isInteger(value) && value >= 0), `${key}: ${value}`);
    }
    if (ladder.price_decimals !== null) {
      for (const [price] of [...ladder.bids, ...ladder.asks]) {
        // At d decimals the price prints whole: nothing beyond the tick size (a double's
        // own rounding aside).
        const shown = Number(price.toFixed(ladder.price_decimals));
        assert.ok(Math.abs(shown - price) <= 1e-9 * Math.max(1, Math.abs(price)), `${price} at ${ladder.price_decimals} decimals`);
      }
    }
    s.send({ op: "unsubscribe", topic });
    await s.next((f) => f.type === "unsubscribed" && f.topic === topic, 10_000, from);
  });

  test("ticks on exactly the subscribed topic, 64-bit fields as strings", { timeout: config.liveTimeoutMs + 30_000 }, async () => {
    const from = s.frames.length;
    s.send({ op: "subscribe", topic: TICK });
    const subscribed = await s.next((f) => f.type === "subscribed" && f.topic === TICK, 30_000, from);
    assert.deepEqual(subscribed, { type: "subscribed", topic: TICK });
    const messages = [];
    await s.next((f) => {
      if (f.type === "message") messages.push(f);
      return messages.length >= 3;
    }, config.liveTimeoutMs, from);
    for (const m of messages) {
      assert.equal(m.topic, TICK);
      assert.equal(m.message_type, "Tick");
      assert.equal(m.data.ticker, config.ticker);
      for (const key of ["timestamp_ms", "ingested_at_ms", "sequence", "publisher_epoch"]) {
        assert.match(m.data[key], INT64, `${key} is a decimal string`);
      }
      assert.equal(typeof m.data.price, "number");
      assert.ok(["SIDE_UNSPECIFIED", "BUY", "SELL"].includes(m.data.side), "enums as names");
    }
    s.send({ op: "unsubscribe", topic: TICK });
    await s.next((f) => f.type === "unsubscribed" && f.topic === TICK, 10_000, from);
  });
});
