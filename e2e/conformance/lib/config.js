"use strict";
// Where the platform is, from the environment (README.md, "Endpoints").

const path = require("node:path");

function env(name, fallback) {
  const value = process.env[name];
  return value === undefined || value === "" ? fallback : value;
}

function seconds(name, fallback) {
  const value = Number(env(name, fallback));
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number`);
  return value * 1000;
}

const config = Object.freeze({
  requestEndpoint: env("MDP_REQUEST_ENDPOINT", "tcp://127.0.0.1:5559"),
  marketDataEndpoint: env("MDP_MARKET_DATA_ENDPOINT", "tcp://127.0.0.1:5558"),
  gateway: env("MDP_GATEWAY_URL", "http://127.0.0.1:8090").replace(/\/+$/, ""),
  gatewayToken: env("MDP_GATEWAY_TOKEN", ""),
  ticker: env("MDP_TICKER", "BINANCE:BTC/USDT"),
  proto: env("MDP_PROTO", path.resolve(__dirname, "..", "..", "..", "proto", "marketdata.proto")),
  // The platform's endpoints.json (`make run`: .data/run/endpoints.json; compose:
  // infra/compose/endpoints.json at the default ports); empty: its checks skip.
  endpointsFile: env("MDP_ENDPOINTS_FILE", ""),
  requestTimeoutMs: seconds("MDP_REQUEST_TIMEOUT_S", 10),
  historyTimeoutMs: seconds("MDP_HISTORY_TIMEOUT_S", 180),
  liveTimeoutMs: seconds("MDP_LIVE_TIMEOUT_S", 240),
  settleMs: seconds("MDP_SUBSCRIBE_SETTLE_S", 0.3),
});

module.exports = { config };
