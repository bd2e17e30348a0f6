// The gateway's chart page: history from POST /history, live candles, trades and the
// order book's ladder over /ws (docs/protocol.md "Gateway"). State for tests and curious
// users: window.chartState.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const auth = token ? { Authorization: "Bearer " + token } : {};
const $ = (id) => document.getElementById(id);

const state = (window.chartState = {
  ticker: "", period: 0, candles: 0, historyCandles: 0, liveUpdates: 0, lastLive: null,
  trades: 0, integrity: null, requestId: null, feed: null, errors: [], ready: false,
  loadedAt: null, answeredAt: null, firstChartAt: null, // ms since navigation start
  timings: null, // the last history answer's: the gateway's (Server-Timing) and this page's, ms
  sequenceEvents: 0,
  // The ladder the gateway sends (`book` frames) and what happened to the book (`book_event`).
  book: { updates: 0, inSync: false, bestBid: null, bestAsk: null, spread: null, levels: [0, 0],
          exchangeSequence: null, events: [] },
});

// Enum names and error codes in words (static/words.json); a name without words shows as is.
let words = {};
const say = (group, name) => (words[group] && words[group][name]) || name;
const problem = (code, reason) => `${say("error_code", code)}${reason ? ": " + reason : ""} (${code})`;

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
  for (const [text, cls] of [[time, ""], [say("side", data.side), data.side], [data.price, ""], [data.amount, ""]]) {
    const cell = document.createElement("td");
    cell.textContent = text;
    if (cls) cell.className = cls;
    row.appendChild(cell);
  }
  const body = $("trades").tBodies[0];
  body.insertBefore(row, body.firstChild);
  while (body.rows.length > 25) body.deleteRow(-1);
}

// The integrity report (docs/protocol.md, "Integrity report"), enums in words.
function showReport(answer) {
  const report = { request_id: answer.request_id, ...answer.integrity,
                   status: say("status", answer.status), source: say("source", answer.integrity.source) };
  for (const cell of document.querySelectorAll("#report td")) {
    const value = report[cell.dataset.key];
    cell.textContent = value === undefined ? "-" : value;
    cell.className = cell.dataset.key === "missing_candles" && Number(value) > 0 ? "bad" : "";
  }
}

// --- the order book: the gateway's ladder, drawn as sent -------------------------

// A price or amount at the market's tick or lot size: the frame's decimals (null: the
// gateway has no market metadata, shown as it comes), so a column has one width.
const atStep = (value, decimals) => (decimals === null || decimals === undefined
  ? String(+value.toPrecision(15)) : value.toFixed(decimals));

// Rows of [price, amount], best first; each amount cell carries a bar of its share of the
// largest amount shown, so the ladder doubles as a depth picture.
function ladderRows(body, levels, max, colour, frame) {
  body.replaceChildren();
  for (const [price, amount] of levels) {
    const row = body.insertRow();
    const p = row.insertCell();
    p.textContent = atStep(price, frame.price_decimals);
    p.className = "price";
    const a = row.insertCell();
    a.textContent = atStep(amount, frame.amount_decimals);
    const share = max > 0 ? Math.round((100 * amount) / max) : 0;
    a.style.background = `linear-gradient(to left, ${colour} ${share}%, transparent ${share}%)`;
  }
}

function drawBook(frame) {
  const max = Math.max(0, ...frame.bids.map((l) => l[1]), ...frame.asks.map((l) => l[1]));
  ladderRows($("asks"), [...frame.asks].reverse(), max, "#4a1f22", frame); // best ask next to the spread
  ladderRows($("bids"), frame.bids, max, "#16403b", frame);
  $("spread").textContent = frame.spread === null ? "-" : atStep(frame.spread, frame.price_decimals);
  $("ladder").classList.toggle("stale", !frame.in_sync);
  $("book-state").textContent = frame.in_sync ? "live" : "out of sync, waiting for a snapshot";
  $("book-state").className = "book-state" + (frame.in_sync ? "" : " bad");
  Object.assign(state.book, { updates: state.book.updates + 1, inSync: frame.in_sync,
                              bestBid: frame.best_bid, bestAsk: frame.best_ask, spread: frame.spread,
                              levels: [frame.bids.length, frame.asks.length],
                              exchangeSequence: frame.exchange_sequence });
}

let resetShown = null;

// A reset (the feed rebuilt the book: a gap at the exchange, a bad checksum, a reconnect), a
// gap (messages lost on the way here) or a resync, in words; a reset outlines the ladder.
function bookEvent(frame) {
  const text = frame.kind === "reset"
    ? `${say("book_event", "reset")}: ${say("book_reset", frame.reset)}${frame.reason ? " (" + frame.reason + ")" : ""}`
    : frame.kind === "gap"
      ? `${say("book_event", "gap")}${Number(frame.missed) ? ` (${frame.missed} messages)` : ""}`
      : `${say("book_event", "resynced")} after ${frame.waited_ms} ms`;
  $("book-event").textContent = `${new Date().toISOString().slice(11, 19)} ${text}`;
  $("book-event").className = frame.kind === "resynced" ? "" : "bad";
  state.book.events.push({ kind: frame.kind, reset: frame.reset, text });
  if (frame.kind === "reset") {
    $("ladder").classList.add("reset");
    clearTimeout(resetShown);
    resetShown = setTimeout(() => $("ladder").classList.remove("reset"), 3000);
  }
}

function clearBook() {
  for (const id of ["asks", "bids"]) $(id).replaceChildren();
  $("spread").textContent = "-";
  $("book-state").textContent = "-";
  $("book-event").textContent = "";
  $("book-feed").textContent = "";
  state.book = { updates: 0, inSync: false, bestBid: null, bestAsk: null, spread: null,
                 levels: [0, 0], exchangeSequence: null, events: [] };
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
    else if (frame.type === "book") drawBook(frame);
    else if (frame.type === "book_event") bookEvent(frame);
    else if (frame.type === "feed_status") {
      const { state: feed, error_code: code, reason } = frame.data;
      const text = say("feed_state", feed) + (code ? `: ${problem(code, reason)}` : reason ? `: ${reason}` : "");
      if (frame.topic.endsWith("|book")) { // the book's own feed (trades and book are separate)
        state.book.feed = feed;
        $("book-feed").textContent = text;
      } else {
        state.feed = feed;
        $("feed").textContent = text;
      }
    } else if (frame.type === "sequence") {
      state.sequenceEvents += 1;
      const count = frame.kind === "gap" ? `${frame.missed} ` : frame.candles ? `${frame.candles} ` : "";
      $("sequence").textContent = `${count}${say("sequence", frame.kind)}${frame.reason ? ": " + frame.reason : ""}`;
    } else if (frame.type === "error") showStatus(`${frame.topic || ""}: ${problem(frame.error_code, frame.reason)}`, true);
    else if (frame.type === "dropped") showStatus(`${frame.count} live messages dropped (slow page)`, true);
  };
}

function watch(ticker, period) {
  const next = [`${ticker}|ohlc:${period}`, `${ticker}|tick`, `${ticker}|book`];
  wsTopics.filter((t) => !next.includes(t)).forEach((t) => send("unsubscribe", t));
  next.filter((t) => !wsTopics.includes(t)).forEach((t) => send("subscribe", t));
  wsTopics = next;
}

// --- history --------------------------------------------------------------------

// `Server-Timing: notify;dur=3590.2;desc="...", read;dur=...` -> {notify: 3590.2, read: ...} (ms)
function serverTiming(header) {
  const out = {};
  for (const part of (header || "").split(",")) {
    const [name, ...params] = part.trim().split(";");
    const dur = params.map((p) => p.trim()).find((p) => p.startsWith("dur="));
    if (name && dur) out[name] = Number(dur.slice(4));
  }
  return out;
}

const seconds = (ms) => `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;

async function load() {
  const ticker = $("ticker").value.trim().toUpperCase();
  const period = Number($("period").value);
  Object.assign(state, { ticker, period, ready: false, historyCandles: 0, liveUpdates: 0,
                         lastLive: null, integrity: null, requestId: null });
  bars.clear();
  redraw();
  $("trades").tBodies[0].replaceChildren();
  if (ticker !== state.book.ticker) clearBook();
  state.book.ticker = ticker;
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
    const text = await resp.text();
    state.answeredAt = performance.now();
    let answer;
    try {
      answer = JSON.parse(text);
    } catch {
      throw new Error(`the gateway answered ${resp.status}: ${text.slice(0, 200)}`);
    }
    if (!resp.ok) throw new Error(problem(answer.error_code, answer.reason));
    for (const c of answer.candles) {
      const b = bar(c);
      if (!bars.has(b.time)) bars.set(b.time, b); // a live update already there is newer
    }
    redraw();
    chart.timeScale().fitContent();
    Object.assign(state, { historyCandles: answer.candles.length, integrity: answer.integrity,
                           requestId: answer.request_id, ready: true });
    const drawn = performance.now();
    if (state.firstChartAt === null) state.firstChartAt = drawn;
    // What the gateway measured (the platform's time, whatever this browser's clock does),
    // then this page's own round trip and drawing.
    const gateway = serverTiming(resp.headers.get("Server-Timing"));
    state.timings = { ...gateway, roundTrip: state.answeredAt - started, draw: drawn - state.answeredAt };
    showReport(answer);
    const platform = "notify" in gateway
      ? `submit to notification ${seconds(gateway.notify)}, rows read ${seconds(gateway.read)}; `
      : "";
    showStatus(`${answer.candles.length} candles (${say("status", answer.status)}): ${platform}` +
               `answer here after ${seconds(state.timings.roundTrip)}, drawn in ${state.timings.draw.toFixed(0)} ms; live`);
  } catch (err) {
    showStatus(`history failed: ${err.message}`, true);
  }
}

async function init() {
  const params = new URLSearchParams(location.search);
  let info = { tickers: [], periods: [60] };
  try {
    const [infoResp, wordsResp] = await Promise.all([fetch("info", { headers: auth }),
                                                     fetch("static/words.json", { headers: auth })]);
    if (infoResp.ok) info = await infoResp.json();
    else showStatus(`gateway answered ${infoResp.status}`, true);
    if (wordsResp.ok) words = await wordsResp.json(); // else names as they are
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
