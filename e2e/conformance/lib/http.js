"use strict";
// The gateway's HTTP side (docs/protocol.md "Gateway"), with Node's own fetch.

const { config } = require("./config");

function headers(extra = {}) {
  const out = { ...extra };
  if (config.gatewayToken) out.Authorization = `Bearer ${config.gatewayToken}`;
  return out;
}

/** { status, headers, text, json (parsed when the body is JSON), bytes }. */
async function call(method, route, { body, accept, timeoutMs = config.historyTimeoutMs } = {}) {
  const response = await fetch(`${config.gateway}${route}`, {
    method,
    headers: headers({
      ...(body === undefined ? {} : { "Content-Type": "application/json" }),
      ...(accept ? { Accept: accept } : {}),
    }),
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  const type = response.headers.get("content-type") || "";
  const result = { status: response.status, headers: response.headers, contentType: type, bytes };
  if (type.startsWith("application/json")) result.json = JSON.parse(bytes.toString("utf8"));
  return result;
}

/** The WebSocket URL of the gateway (`?token=` when a token is configured). */
function wsUrl() {
  const url = new URL("/ws", config.gateway);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (config.gatewayToken) url.searchParams.set("token", config.gatewayToken);
  return url.toString();
}

const INT64 = /^-?[0-9]+$/;

module.exports = { INT64, call, wsUrl };
