"use strict";
// endpoints.json (docs/protocol.md "Ports and sockets"): the platform's file lists
// every client-facing address, and each answers as documented. MDP_ENDPOINTS_FILE
// names the file of the platform under test (`make run`: .data/run/endpoints.json;
// compose: infra/compose/endpoints.json, or one written for its ports); unset: skipped.

const assert = require("node:assert/strict");
const fs = require("node:fs");
const { describe, test } = require("node:test");
const WebSocket = require("ws");
const zmq = require("zeromq");

const { config } = require("../lib/config");
const wire = require("../lib/wire");

const KEYS = ["catalog", "gateway", "gateway_ws", "market_data", "metrics", "request", "s3"];
const TIMEOUT_MS = 10_000;

function clients() {
  const document = JSON.parse(fs.readFileSync(config.endpointsFile, "utf8"));
  assert.equal(typeof document.clients, "object", "a `clients` object");
  return document.clients;
}

async function get(url) {
  const response = await fetch(url, { signal: AbortSignal.timeout(TIMEOUT_MS) });
  const text = await response.text();
  return { status: response.status, text };
}

describe("endpoints.json", { skip: config.endpointsFile === "" && "MDP_ENDPOINTS_FILE is not set" }, () => {
  test("its clients object has every documented key, in the documented forms", () => {
    const c = clients();
    assert.deepEqual(Object.keys(c).sort(), KEYS);
    assert.ok(c.request.length >= 1 && c.request.length === c.market_data.length, "one of each per relay");
    for (const url of [...c.request, ...c.market_data]) assert.match(url, /^tcp:\/\/[^:]+:\d+$/);
    assert.match(c.catalog, /^http:\/\/[^:]+:\d+$/);
    assert.match(c.s3, /^https?:\/\/[^:]+:\d+$/);
    if (c.gateway !== null) {
      assert.match(c.gateway, /^https?:\/\/[^:]+:\d+$/);
      assert.equal(c.gateway_ws, `${c.gateway.replace(/^http/, "ws")}/ws`);
    }
    for (const url of Object.values(c.metrics)) assert.match(url, /^http:\/\/[^:]+:\d+$/);
  });

  test("it names the addresses this suite was given", () => {
    const c = clients();
    assert.ok(c.request.includes(config.requestEndpoint), `${config.requestEndpoint} in ${c.request}`);
    assert.ok(c.market_data.includes(config.marketDataEndpoint), `${config.marketDataEndpoint} in ${c.market_data}`);
    assert.equal(c.gateway, config.gateway);
  });

  test("every relay's request address answers a request in its own type", async () => {
    for (const endpoint of clients().request) {
      const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: TIMEOUT_MS });
      dealer.connect(endpoint);
      try {
        await dealer.send([Buffer.alloc(0), ...wire.envelope("RequestStatusQuery", { request_id: wire.newId("conf-ep") })]);
        const reply = await dealer.receive();
        const { name, message } = wire.decodeEnvelope(reply.slice(1));
        assert.equal(name, "RequestStatusReply", endpoint);
        assert.equal(message.status, "NOT_FOUND", `${endpoint}: ${JSON.stringify(message)}`);
      } finally {
        dealer.close();
      }
    }
  });

  test("every relay's market-data address publishes the pipeline's heartbeat", { timeout: 60_000 }, async () => {
    for (const endpoint of clients().market_data) {
      const sub = new zmq.Subscriber({ linger: 0, receiveTimeout: TIMEOUT_MS });
      sub.connect(endpoint);
      sub.subscribe("PIPELINE:status");
      try {
        const frames = await sub.receive(); // PipelineStatus every second ("Pipeline liveness")
        assert.equal(frames[0].toString(), "PIPELINE:status", endpoint);
        assert.equal(wire.decodeEnvelope(frames.slice(1)).name, "PipelineStatus");
      } finally {
        sub.close();
      }
    }
  });

  test("the gateway's HTTP and WebSocket addresses answer", async (t) => {
    const c = clients();
    if (c.gateway === null) return t.skip("this platform runs no gateway");
    const health = await get(`${c.gateway}/healthz`);
    assert.equal(health.status, 200, health.text);
    const url = new URL(c.gateway_ws);
    if (config.gatewayToken) url.searchParams.set("token", config.gatewayToken);
    await new Promise((resolve, reject) => {
      const ws = new WebSocket(url.toString());
      ws.once("open", () => {
        ws.close();
        resolve();
      });
      ws.once("error", reject);
    });
  });

  test("the catalog hands out the S3 endpoint in GET /v1/config", async () => {
    const answer = await get(`${clients().catalog}/v1/config`);
    assert.equal(answer.status, 200, answer.text);
    const body = JSON.parse(answer.text);
    const handed = { ...(body.defaults || {}), ...(body.overrides || {}) };
    assert.match(handed["s3.endpoint"] || "", /^https?:\/\//, "s3.endpoint for clients (docs/client-guide.md: Reading the rows without the SDK)");
  });

  test("its s3 address is an S3 service this host reaches (compose: not the catalog's minio:9000)", async () => {
    // "Reading the rows without the SDK": a client on the host reads the table files here,
    // overriding the catalog's s3.endpoint where that names a host only containers resolve.
    const answer = await get(`${clients().s3}/warehouse?list-type=2&max-keys=1`);
    assert.ok([200, 403].includes(answer.status), `HTTP ${answer.status}: ${answer.text.slice(0, 200)}`);
    assert.match(answer.text, /<(ListBucketResult|Error)[\s>]/, "an S3 XML answer");
  });

  test("every service's metrics address serves /healthz", async () => {
    for (const [name, url] of Object.entries(clients().metrics)) {
      const answer = await get(`${url}/healthz`);
      assert.ok([200, 503].includes(answer.status), `${name}: HTTP ${answer.status}`);
      assert.ok("status" in JSON.parse(answer.text), `${name}: a status in ${answer.text}`);
    }
  });
});
