// The gateway's chart page: history from POST /history, live candles and trades over
// /ws (docs/protocol.md "Gateway"). State for tests and curious users: window.chartState.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const auth = token ? { Authorization: "Bearer " + token } : {};
const $ = (id) => document.getElementById(id);

const state = (window.chartState = {
  ticker: "", period: 0, candles: 0, historyCandles: 0, liveUpdates: 0, lastLive: null,
  trades: 0, integrity: null, requestId: null, feed: null, errors: [], ready: false,
  loadedAt: null, answeredAt: null, firstChartAt: null, // ms since navigation start
});

function showStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = "status" + (isError ? " error" : "");
  if (isError) state.errors.push(text);
}

if (typeof LightweightCharts === "undefined") {
  showStatus("chart library missing: run `make gateway-assets` on the gateway's host", true);
  throw new Error("lightweight-charts not loaded");
}

const chart = LightweightCharts.createChart($("chart"), {
  autoSize: true,
  layout: { background: { color: "#101418" }, textColor: "#d8dee4" },
  grid: { vertLines: { color: "#1c232a" }, horzLines: { color: "#1c232a" } },
  timeScale: { timeVisible: true, secondsVisible: false },
});
const series = chart.addSeries(LightweightCharts.CandlestickSeries, {
  upColor: "#26a69a", downColor: "#ef5350", borderVisible: false,
  wickUpColor: "#26a69a", wickDownColor: "#ef5350",
});
const bars = new Map(); // open time (s) -> bar: the last message for a candle wins

// 64-bit integers arrive as decimal strings (exact ids); times in ms fit a Number.
function bar(c) {
  return { time: Math.floor(Number(c.open_time_ms) / 1000), open: c.open, high: c.high, low: c.low, close: c.close };
}

function redraw() {
  series.setData([...bars.values()].sort((a, b) => a.time - b.time));
  state.candles = bars.size;
}

function liveCandle(data) {
  if (data.period_seconds !== state.period || data.ticker !== state.ticker) return;
  const b = bar(data);
  const newest = bars.size ? Math.max(...bars.keys()) : -Infinity;
  bars.set(b.time, b);
  if (b.time >= newest) series.update(b); else redraw(); // a correction or a recovered candle
  state.candles = bars.size;
  state.liveUpdates += 1;
  state.lastLive = { time: b.time, close: b.close, closed: data.closed, at: Date.now() };
}

function trade(data) {
  state.trades += 1;
  const row = document.createElement("tr");
  const time = new Date(Number(data.timestamp_ms)).toISOString().slice(11, 19);
  for (const [text, cls] of [[time, ""], [data.side, data.side], [data.price, ""], [data.amount, ""]]) {
    const cell = document.createElement("td");
    cell.textContent = text;
    if (cls) cell.className = cls;
    row.appendChild(cell);
  }
  const body = $("trades").tBodies[0];
  body.insertBefore(row, body.firstChild);
  while (body.rows.length > 25) body.deleteRow(-1);
}

// The integrity report's enum values in words (docs/protocol.md, "Integrity report").
const SOURCES = {
  SOURCE_UNSPECIFIED: "unknown (an older platform)",
  SOURCE_EXCHANGE: "fetched from the exchange",
  SOURCE_STORAGE: "already stored (exchange not asked)",
  SOURCE_STORAGE_AND_EXCHANGE: "stored, gaps fetched from the exchange",
};

function showReport(answer) {
  const report = { request_id: answer.request_id, ...answer.integrity };
  if (report.source in SOURCES) report.source = SOURCES[report.source];
  for (const cell of document.querySelectorAll("#report td")) {
    const value = report[cell.dataset.key];
    cell.textContent = value === undefined ? "-" : value;
    cell.className = cell.dataset.key === "missing_candles" && Number(value) > 0 ? "bad" : "";
  }
}

// --- live: one WebSocket, resubscribed on every load ----------------------------

let ws = null;
let wsTopics = [];
const send = (op, topic) => ws && ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ op, topic }));

function connect() {
  const url = new URL("ws", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  if (token) url.searchParams.set("token", token);
  ws = new WebSocket(url);
  ws.onopen = () => wsTopics.forEach((t) => send("subscribe", t));
  ws.onclose = () => { showStatus("live connection lost; reconnecting", true); setTimeout(connect, 2000); };
  ws.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    if (!wsTopics.includes(frame.topic) && frame.type !== "dropped") return; // an old subscription
    if (frame.type === "message" && frame.message_type === "OHLC") liveCandle(frame.data);
    else if (frame.type === "message" && frame.message_type === "Tick") trade(frame.data);
    else if (frame.type === "feed_status") {
      state.feed = frame.data.state;
      $("feed").textContent = `${frame.data.state} ${frame.data.error_code || ""} ${frame.data.reason || ""}`;
    } else if (frame.type === "error") showStatus(`${frame.topic || ""}: ${frame.error_code}: ${frame.reason}`, true);
    else if (frame.type === "dropped") showStatus(`${frame.count} live messages dropped (slow page)`, true);
  };
}

function watch(ticker, period) {
  const next = [`${ticker}|ohlc:${period}`, `${ticker}|tick`];
  wsTopics.filter((t) => !next.includes(t)).forEach((t) => send("unsubscribe", t));
  next.filter((t) => !wsTopics.includes(t)).forEach((t) => send("subscribe", t));
  wsTopics = next;
}

// --- history --------------------------------------------------------------------

async function load() {
  const ticker = $("ticker").value.trim().toUpperCase();
  const period = Number($("period").value);
  Object.assign(state, { ticker, period, ready: false, historyCandles: 0, liveUpdates: 0,
                         lastLive: null, integrity: null, requestId: null });
  bars.clear();
  redraw();
  $("trades").tBodies[0].replaceChildren();
  history.replaceState(null, "", `?ticker=${encodeURIComponent(ticker)}&period=${period}` + (token ? `&token=${encodeURIComponent(token)}` : ""));
  watch(ticker, period); // subscribe first: live candles during the request are kept
  showStatus(`loading ${ticker} history ...`);
  const started = performance.now();
  try {
    const resp = await fetch("history", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...auth },
      body: JSON.stringify({ ticker, period, start: $("range").value, end: "now" }),
    });
    const answer = await resp.json();
    state.answeredAt = performance.now();
    if (!resp.ok) throw new Error(`${answer.error_code}: ${answer.reason}`);
    for (const c of answer.candles) {
      const b = bar(c);
      if (!bars.has(b.time)) bars.set(b.time, b); // a live update already there is newer
    }
    redraw();
    chart.timeScale().fitContent();
    Object.assign(state, { historyCandles: answer.candles.length, integrity: answer.integrity,
                           requestId: answer.request_id, ready: true });
    if (state.firstChartAt === null) state.firstChartAt = performance.now();
    showReport(answer);
    showStatus(`${answer.candles.length} candles in ${((performance.now() - started) / 1000).toFixed(1)} s; live`);
  } catch (err) {
    showStatus(`history failed: ${err.message}`, true);
  }
}

async function init() {
  const params = new URLSearchParams(location.search);
  let info = { tickers: [], periods: [60] };
  try {
    const resp = await fetch("info", { headers: auth });
    if (resp.ok) info = await resp.json();
    else showStatus(`gateway answered ${resp.status}`, true);
  } catch (err) {
    showStatus(`gateway unreachable: ${err.message}`, true);
  }
  for (const t of info.tickers) $("tickers").appendChild(new Option(t, t));
  for (const p of info.periods) $("period").appendChild(new Option(p % 3600 ? `${p / 60}m` : `${p / 3600}h`, p));
  $("ticker").value = params.get("ticker") || info.tickers[0] || "BINANCE:BTC/USDT";
  if (params.get("period")) $("period").value = params.get("period");
  if (params.get("range")) $("range").value = params.get("range");
  $("load").onclick = load;
  $("ticker").onchange = load;
  $("period").onchange = load;
  $("range").onchange = load;
  connect();
  await load();
}

state.loadedAt = performance.now();
init();
