"use strict";
// The wire contract as docs/protocol.md states it ("Envelope", "Message types",
// "Topics", "Relay replies"), implemented from the docs alone: no project code.
// Messages are decoded with protobufjs from proto/marketdata.proto; 64-bit
// integers become decimal strings (exact), enums their names.

const path = require("node:path");
const { setTimeout: sleep } = require("node:timers/promises");
const protobuf = require("protobufjs");
const zmq = require("zeromq");

const { config } = require("./config");
const { Inbox } = require("./inbox");

const PROTOCOL_VERSION = 0x01;

// docs/protocol.md "Message types": type ID -> message.
const TYPE_IDS = Object.freeze({
  DataRequest: 0x01,
  DataResponse: 0x02,
  IngestorControl: 0x03,
  Tick: 0x04,
  OHLC: 0x05,
  Market: 0x06,
  OHLCRequest: 0x07,
  Response: 0x08,
  CEPTriggerRequest: 0x09,
  CEPTriggerAck: 0x0a,
  CEPTriggerEvent: 0x0b,
  OHLCBatch: 0x0c,
  SubmitHistoricalRequest: 0x10,
  SubmitResponse: 0x11,
  HistoryReadyNotification: 0x12,
  IngestorStatus: 0x13,
  FeedStatus: 0x14,
  PipelineStatus: 0x15,
  BookSnapshot: 0x16,
  BookDelta: 0x17,
  RequestStatusQuery: 0x18,
  RequestStatusReply: 0x19,
  IngestClaim: 0x20,
  ExchangeServing: 0x23,
});
const NAME_BY_ID = new Map(Object.entries(TYPE_IDS).map(([name, id]) => [id, name]));

const root = new protobuf.Root();
root.loadSync(config.proto, { keepCase: true }); // field names as in the .proto

function type(name) {
  return root.lookupType(`mdproto.${name}`);
}

function enumValue(enumPath, name) {
  const value = root.lookupEnum(`mdproto.${enumPath}`).values[name];
  if (value === undefined) throw new Error(`no ${name} in ${enumPath}`);
  return value;
}

const TO_OBJECT = { longs: String, enums: String, defaults: true, arrays: true, objects: true };

/** Frame 2 of the envelope: [type ID][protobuf payload]. */
function body(name, fields) {
  // encode() takes the fields as given (numeric enums, even unknown ones, as on the wire).
  const payload = type(name).encode(fields).finish();
  return Buffer.concat([Buffer.from([TYPE_IDS[name]]), Buffer.from(payload)]);
}

/** The two envelope frames: [version][type ID + payload]. */
function envelope(name, fields) {
  return [Buffer.from([PROTOCOL_VERSION]), body(name, fields)];
}

/** Two envelope frames -> { name, message } (message as a plain object). */
function decodeEnvelope(frames) {
  if (frames.length !== 2) throw new Error(`expected 2 envelope frames, got ${frames.length}`);
  const [version, data] = frames;
  if (version.length !== 1 || version[0] !== PROTOCOL_VERSION) {
    throw new Error(`bad version frame ${version.toString("hex")}`);
  }
  if (data.length < 1) throw new Error("empty message frame");
  const name = NAME_BY_ID.get(data[0]);
  if (name === undefined) throw new Error(`unknown type 0x${data[0].toString(16)}`);
  const t = type(name);
  return { name, typeId: data[0], message: t.toObject(t.decode(data.subarray(1)), TO_OBJECT) };
}

// --- :5559 requests over a DEALER -------------------------------------------------

/**
 * Send `frames` on a fresh DEALER to the relay's ROUTER and return the reply's
 * frames. With `delimiter` (default) an empty frame goes first, as a REQ socket
 * sends it; the reply then starts with that empty frame too.
 */
async function exchange(frames, { delimiter = true, timeoutMs = config.requestTimeoutMs } = {}) {
  const sock = new zmq.Dealer({ linger: 0, receiveTimeout: timeoutMs });
  sock.connect(config.requestEndpoint);
  try {
    await sock.send(delimiter ? [Buffer.alloc(0), ...frames] : frames);
    return await sock.receive();
  } catch (error) {
    if (error.code === "EAGAIN") {
      throw new Error(`no reply from ${config.requestEndpoint} within ${timeoutMs} ms`);
    }
    throw error;
  } finally {
    sock.close();
  }
}

/** A request as a REQ client sends it; the decoded reply ({ name, message }). */
async function request(name, fields) {
  const reply = await exchange(envelope(name, fields));
  if (reply.length !== 3 || reply[0].length !== 0) {
    throw new Error(`reply frames are not [empty][version][type+payload]: ${reply.length} frames`);
  }
  return decodeEnvelope(reply.slice(1));
}

// --- :5558 subscriptions ----------------------------------------------------------

/** A SUB on the relay's market-data XPUB that keeps what arrives, in order. */
class Subscriber {
  constructor() {
    this.sock = new zmq.Subscriber({ linger: 0 });
    this.inbox = new Inbox();
    this.errors = [];
    this.closed = false;
  }

  /** Connect, wait for the ZMTP handshake, subscribe, then let the subscription travel. */
  async open(topics) {
    const events = this.sock.events;
    const handshake = (async () => {
      for await (const event of events) {
        if (event.type === "handshake") return true;
      }
      return false;
    })();
    this.sock.connect(config.marketDataEndpoint);
    const ok = await Promise.race([handshake, sleep(config.requestTimeoutMs).then(() => false)]);
    if (!ok) {
      this.close(); // else the pending socket keeps the process alive
      throw new Error(`no ZMTP handshake with ${config.marketDataEndpoint} within ${config.requestTimeoutMs} ms`);
    }
    this.subscribe(...topics);
    this.loop = this.read();
    await sleep(config.settleMs); // no subscription ack in ZeroMQ: give it time to reach upstream
    return this;
  }

  subscribe(...topics) {
    for (const topic of topics) this.sock.subscribe(topic);
  }

  async read() {
    try {
      for await (const frames of this.sock) {
        const item = { topic: frames[0].toString("utf8"), frames, at: Date.now() };
        try {
          Object.assign(item, decodeEnvelope(frames.slice(1)));
        } catch (error) {
          item.error = error;
          this.errors.push(`${item.topic}: ${error.message}`);
        }
        this.inbox.push(item);
      }
    } catch (error) {
      if (!this.closed) this.errors.push(`receive failed: ${error.message}`);
    }
  }

  /** What arrived so far: { topic, frames, at, and name + message, or error }. */
  get received() {
    return this.inbox.items;
  }

  /** The first received item (from index `from`) that `want` accepts, or null after timeoutMs. */
  next(want, timeoutMs, from = 0) {
    return this.inbox.next(want, timeoutMs, from);
  }

  close() {
    this.closed = true;
    this.sock.close();
  }
}

async function subscriber(...topics) {
  return new Subscriber().open(topics);
}

/** A client-generated id: 1-128 characters of [A-Za-z0-9_.-]. */
function newId(prefix) {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
}

module.exports = {
  PROTOCOL_VERSION,
  TYPE_IDS,
  body,
  decodeEnvelope,
  enumValue,
  envelope,
  exchange,
  newId,
  request,
  subscriber,
  type,
};
