"use strict";
// A CEP trigger's life (docs/protocol.md "CEP triggers"): subscribe to the event
// topic, REGISTER (ack OK + event_topic), ARMED, LIST, CANCEL, CANCELLED (final).

const assert = require("node:assert/strict");
const { describe, test } = require("node:test");

const { config } = require("../lib/config");
const wire = require("../lib/wire");

const action = (name) => wire.enumValue("CEPTriggerRequest.Action", name);
const PRICE_ABOVE = wire.enumValue("CEPCondition.Kind", "PRICE_ABOVE");
const PER_REQUEST = 2;
const OPTS = { timeout: 2 * config.liveTimeoutMs + 30_000 };

describe("CEP trigger", () => {
  test("REGISTER, ARMED, LIST, CANCEL, CANCELLED on CEP:{trigger_id}", OPTS, async () => {
    const triggerId = wire.newId("conf-trig");
    const clientId = wire.newId("conf-cep");
    const topic = `CEP:${triggerId}`;
    const sub = await wire.subscriber(topic);
    try {
      const { name, message: ack } = await wire.request("CEPTriggerRequest", {
        trigger_id: triggerId,
        client_id: clientId,
        action: action("REGISTER"),
        ticker: config.ticker,
        // A price no market reaches: the trigger never fires.
        conditions: [{ kind: PRICE_ABOVE, threshold: 1e15 }],
        notify: PER_REQUEST,
      });
      assert.equal(name, "CEPTriggerAck");
      assert.equal(ack.status, "OK", JSON.stringify(ack));
      assert.equal(ack.trigger_id, triggerId);
      assert.equal(ack.event_topic, topic);

      const armed = await sub.next((it) => it.topic === topic && it.message && it.message.kind === "ARMED", config.liveTimeoutMs);
      assert.ok(armed, `no ARMED event on ${topic}`);
      assert.equal(armed.frames[2][0], 0x0b, "type byte 0x0B = CEPTriggerEvent");
      assert.equal(armed.message.trigger_id, triggerId);
      assert.equal(armed.message.final, false);
      assert.ok(BigInt(armed.message.sequence) >= 1n);
      assert.notEqual(armed.message.publisher_epoch, "0");

      const { message: listed } = await wire.request("CEPTriggerRequest", {
        client_id: clientId,
        action: action("LIST"),
      });
      assert.equal(listed.status, "OK", JSON.stringify(listed));
      const mine = listed.triggers.find((t) => t.trigger_id === triggerId);
      assert.ok(mine, "LIST names the registered trigger");
      assert.equal(mine.ticker, config.ticker);
      assert.equal(mine.action, "REGISTER");

      const { message: cancelled } = await wire.request("CEPTriggerRequest", {
        trigger_id: triggerId,
        client_id: clientId,
        action: action("CANCEL"),
      });
      assert.equal(cancelled.status, "OK", JSON.stringify(cancelled));
      assert.equal(cancelled.event_topic, "", "empty for CANCEL");

      const last = await sub.next((it) => it.topic === topic && it.message && it.message.kind === "CANCELLED", config.liveTimeoutMs);
      assert.ok(last, `no CANCELLED event on ${topic}`);
      assert.equal(last.message.final, true);
      assert.ok(BigInt(last.message.sequence) > BigInt(armed.message.sequence), "sequenced per topic");
      const fired = sub.received.filter((it) => it.message && it.message.kind === "FIRED");
      assert.deepEqual(fired, [], "an unreachable price never fires");
    } finally {
      sub.close();
    }
  });

  test("NOTIFY_AUTO with a client_id: event_topic RESPONSE:{client_id}; CANCEL of it", async () => {
    const triggerId = wire.newId("conf-trig");
    const clientId = wire.newId("conf-cep");
    const { message: ack } = await wire.request("CEPTriggerRequest", {
      trigger_id: triggerId,
      client_id: clientId,
      action: action("REGISTER"),
      ticker: config.ticker,
      conditions: [{ kind: PRICE_ABOVE, threshold: 1e15 }],
    });
    assert.equal(ack.status, "OK", JSON.stringify(ack));
    assert.equal(ack.event_topic, `RESPONSE:${clientId}`);
    const { message: cancelled } = await wire.request("CEPTriggerRequest", {
      trigger_id: triggerId,
      action: action("CANCEL"),
    });
    assert.equal(cancelled.status, "OK", JSON.stringify(cancelled));
  });
});
