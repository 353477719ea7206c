// Shared helpers of the dashboard pages. User text only ever enters the page as text nodes
// (el(...) children, textContent) or attribute values, never as HTML.
"use strict";

const GS = {};

GS.token = () => localStorage.getItem("gdnSweepToken") || "";
GS.setToken = (value) => localStorage.setItem("gdnSweepToken", value || "");

GS.api = async function (path, opts = {}) {
  const method = opts.method || "GET";
  const headers = { Accept: "application/json" };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  // every call: a service may put reads behind its token too (GDN_SWEEP_TOKEN_FOR_READS)
  if (GS.token()) headers.Authorization = "Bearer " + GS.token();
  const res = await fetch(path, {
    method, headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
  });
  if (res.status === 401 && method === "GET" && !opts.retried && await GS.askToken()) {
    return GS.api(path, { ...opts, retried: true });
  }
  const text = await res.text();
  let data = text;
  try { data = text ? JSON.parse(text) : null; } catch (e) { /* keep the text */ }
  if (!res.ok) {
    const err = new Error(GS.errorText(res.status, data));
    err.status = res.status;
    err.data = data;  // a 422's items, for pages that show each beside its field
    throw err;
  }
  return data;
};

// A read refused for want of the token: ask for it once, however many calls were refused
// together; true when one was given.
GS.askToken = function () {
  if (!GS._asking) {
    GS._asking = Promise.resolve(window.prompt(
      "This service needs its API token (GDN_SWEEP_API_TOKEN) to read its results:"))
      .then((token) => { if (token) GS.setToken(token); return Boolean(token); })
      .finally(() => setTimeout(() => { GS._asking = null; }, 0));
  }
  return GS._asking;
};

// Every page: a banner when the service serves beyond loopback without a token, on purpose
// (`serve --allow-unauthenticated`). Its own fetch: no token prompt for a banner.
GS.showExposure = async function () {
  const headers = GS.token() ? { Authorization: "Bearer " + GS.token() } : {};
  const res = await fetch("/api/options", { headers }).catch(() => null);
  const options = res && res.ok ? await res.json() : null;
  if (!options || !options.open_to_network) return;
  document.body.prepend(GS.el("div", { class: "exposure-banner", role: "alert" },
    "This service is open to the network without a token (--allow-unauthenticated): anyone " +
    "who reaches it can start and cancel sweeps. Set GDN_SWEEP_API_TOKEN and restart it."));
};
document.addEventListener("DOMContentLoaded", () => { GS.showExposure(); });

GS.errorText = function (status, data) {
  if (data && Array.isArray(data.detail)) {
    return data.detail.map((d) => {
      const where = (d.loc || []).filter((p) => p !== "body" && p !== "query").join(".");
      return (where || "request") + ": " + d.msg;
    }).join("\n");
  }
  if (data && typeof data.detail === "string") return data.detail;
  return "HTTP " + status + (typeof data === "string" && data ? ": " + data : "");
};

GS.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;  // CSSOM: the CSP refuses style attributes
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
};

GS.badge = (status) => GS.el("span", { class: "badge s-" + String(status).replace(/[^a-z_]/g, "") },
                             status);

// Numbers as people read them, in the browser's locale: 10234 → "10,200", 0.01234 → "0.0123";
// only tiny values (relative errors) in exponent form.
GS.num = function (value, digits = 3) {
  if (value === null || value === undefined) return "";
  const v = Number(value);
  if (v !== 0 && Math.abs(v) < 1e-3) return v.toExponential(digits - 1).replace(/\.?0+e/, "e");
  return v.toLocaleString(undefined, { maximumSignificantDigits: digits });
};

// Bytes in binary units, always "<number> <unit>" below 1000 of it: 21474836480 → "20 GiB",
// 1536 → "1.5 KiB", 1024000 → "0.977 MiB".
GS.bytes = function (value) {
  if (value === null || value === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = Number(value), i = 0;
  while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1024; i += 1; }
  return GS.num(v) + " " + units[i];
};

GS.pct = (value) => (value === null || value === undefined ? "" : GS.num(100 * value) + "%");

// A duration in seconds: "850 µs", "12.3 ms", "4.56 s", "3 min 12 s", "2 h 5 min".
GS.seconds = function (s) {
  if (s === null || s === undefined) return "";
  const v = Number(s);
  if (v === 0) return "0 s";
  if (v < 1e-3) return GS.num(v * 1e6) + " µs";
  if (v < 1) return GS.num(v * 1e3) + " ms";
  if (v < 60) return GS.num(v) + " s";
  const whole = Math.round(v), h = Math.floor(whole / 3600), m = Math.floor((whole % 3600) / 60);
  return h ? `${h} h ${m} min` : `${m} min ${whole % 60} s`;
};

GS.time = (iso) => (iso ? new Date(iso).toLocaleString() : "");

// "median (fastest–slowest) ×n" of a trial's measured steps, all three in the median's unit.
GS.stepTime = function (t) {
  if (t.step_time_s === null || t.step_time_s === undefined) return "";
  const scale = t.step_time_s < 1 ? 1e3 : 1, unit = scale === 1 ? " s" : " ms";
  const at = (s) => GS.num(s * scale);
  const spread = t.step_time_min_s === null || t.step_time_min_s === undefined ? "" :
    ` (${at(t.step_time_min_s)}–${at(t.step_time_max_s)})`;
  return at(t.step_time_s) + unit + spread + (t.measured_steps ? ` ×${t.measured_steps}` : "");
};

// A run through the kernels' own interpreters (GDN_SWEEP_INTERPRET_KERNELS=1 on a CPU; the
// API's `interpreted`) is a correctness check, never a speed: tables show "interpreted" in
// place of its speeds, and no speed plot draws it.
GS.interpreted = (t) => Boolean(t && t.interpreted);
GS.INTERPRETED_TITLE = "run through the kernels' interpreters: a correctness check, not a speed";
// A speed figure's cell text: `text`, or "interpreted" for such a run.
GS.speed = (t, text) => (GS.interpreted(t) ? "interpreted" : text);
// The kernels value as a table shows it: "fused (interpreted)" for such a run.
GS.kernelsLabel = (t) => (t.kernels || "reference") + (GS.interpreted(t) ? " (interpreted)" : "");

// The compile column's cell: JAX's seconds of lowering and compiling, or "—" for torch, whose
// eager step compiles nothing (it records compile_time_s 0) and whose warm-up steps' extra
// time is not recorded apart from them.
GS.TORCH_COMPILE_TITLE = "torch runs the step eagerly: nothing compiles (the warm-up steps " +
  "before the measured ones are not timed)";
GS.compileCell = (t) => (t.framework === "torch"
  ? GS.el("td", { class: "num muted", title: GS.TORCH_COMPILE_TITLE }, "—")
  : GS.el("td", { class: "num", title: "lowering and XLA compile of the step (and of any " +
                                       "verify reference), before the timed steps" }, GS.seconds(t.compile_time_s)));

// Why a trial did not succeed (its skip reason or error), cut to one line in the table, whole
// in the cell's tooltip: empty for a succeeded trial.
GS.reasonCell = (t) => GS.el("td", { class: t.status === "skipped" ? "reason skip" : "reason",
                                     title: t.error || null },
                             t.status === "succeeded" || !t.error ? "" : t.error.slice(0, 300));

// A table cell with the number of attempts; each attempt's status, hosts and reason as its title.
GS.attempts = function (t) {
  const history = t.attempt_history || [];
  const lines = history.map((a) => `attempt ${a.attempt}: ${a.status}` +
    (a.hosts.length ? ` on ${a.hosts.join(", ")}` : "") + (a.reason ? ` — ${a.reason.slice(0, 300)}` : ""));
  return GS.el("td", { class: "num attempts", title: lines.join("\n") || null },
               history.length > 1 ? `${history.length} (retried)` : (t.attempts || ""));
};

GS.progress = function (done, total) {
  const share = total ? Math.round((100 * done) / total) : 0;
  return GS.el("div", { class: "progress", title: done + " / " + total + " trials done",
                        role: "progressbar", "aria-valuenow": share },
               GS.el("div", { style: "width:" + share + "%" }));
};

GS.FINAL_SWEEP = new Set(["finished", "cancelled", "failed"]);

// rows → Map(key → rows with that key), in first-seen order.
GS.groupBy = function (rows, keyOf) {
  const groups = new Map();
  for (const row of rows) {
    const key = keyOf(row);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(row);
  }
  return groups;
};

// A trial's step settings that differ from the defaults, as a series names them: points of a
// sweep over dp, dtype, sharding, remat, layers, attention CP, layout, kernels or documents
// never share a line (the one-chip baseline has no attn_cp: it is every attn_cp's start).
GS.stepSettings = (t) => [(t.dp || 1) > 1 ? `dp=${t.dp}` : "", t.dtype === "float32" ? "" : t.dtype,
                          t.param_sharding === "replicated" ? "" : t.param_sharding,
                          t.remat === "none" ? "" : `remat=${t.remat}`,
                          (t.layers || "gdn_only") === "gdn_only" ? "" : t.layers,
                          t.attn_cp ? `attn_cp=${t.attn_cp}` : "",
                          (t.layout || "contiguous") === "contiguous" ? "" : t.layout,
                          (t.kernels || "reference") === "reference" ? "" : `kernels=${t.kernels}`,
                          (t.documents || "single") === "single" ? "" : `documents=${t.documents}`]
  .filter(Boolean);
GS.modeLabel = (mode) => (mode === "none" ? "one chip" : mode);

// How a series looks, the same in every plot, so that series differing only in kernels,
// framework or decoder never share a line: hue by CP mode, its other shade (and a thicker
// line) for fused kernels; dash by framework and decoder (jax solid, torch dashed; a hybrid
// decoder's jax dotted, torch dash-dotted); a marker of its own for each framework × decoder.
// GS.series, the legend name, says all of them in words.
GS.MODE_COLORS = { none: ["#444444", "#a0a0a0"], ulysses: ["#1f77b4", "#0a3a66"],
                   p2p: ["#d62728", "#7a1011"], all_gather: ["#2ca02c", "#125712"],
                   log_scan: ["#9467bd", "#4b2a78"] };  // [reference, fused]
GS.DASHES = { jax: { gdn_only: "solid", hybrid: "dot" }, torch: { gdn_only: "dash", hybrid: "dashdot" } };
GS.SYMBOLS = { jax: { gdn_only: "circle", hybrid: "diamond" },
               torch: { gdn_only: "square", hybrid: "triangle-up" } };
GS.PATTERNS = { jax: { gdn_only: "", hybrid: "." }, torch: { gdn_only: "/", hybrid: "x" } };  // bars
GS.STYLE_KEY = "colour: CP mode, darker and thicker for fused kernels; dash: framework and " +
  "decoder (jax solid, torch dashed; hybrid: jax dotted, torch dash-dotted)";
GS.fused = (t) => (t.kernels || "reference") === "fused";
GS.seriesColor = (t) => (GS.MODE_COLORS[t.mode] || ["#7f7f7f", "#3d3d3d"])[GS.fused(t) ? 1 : 0];
GS.seriesStyle = function (t) {
  const framework = t.framework === "torch" ? "torch" : "jax", layers = t.layers === "hybrid" ? "hybrid" : "gdn_only";
  return { color: GS.seriesColor(t), dash: GS.DASHES[framework][layers], width: GS.fused(t) ? 3 : 2,
           symbol: GS.SYMBOLS[framework][layers], pattern: GS.PATTERNS[framework][layers] };
};
// A scatter trace's line and marker for the series of trial `t`.
GS.lineOf = function (t) {
  const s = GS.seriesStyle(t);
  return { line: { color: s.color, dash: s.dash, width: s.width },
           marker: { color: s.color, symbol: s.symbol, size: 7 } };
};
// A series (a line of a plot, a row group of a comparison): framework, mode, step settings.
GS.series = (t) => [t.framework, GS.modeLabel(t.mode), ...GS.stepSettings(t)].join(" ");

GS.header = function (active) {
  const link = (href, text) => GS.el("a", { href, style: active === href ? "font-weight:600" : null },
                                     text);
  document.body.prepend(GS.el("header", {}, GS.el("span", { class: "brand" }, "gdn-sweep"),
    link("/", "Sweeps"), link("/schedules", "Schedules"), link("/regressions", "Regressions"),
    link("/results", "Results"),
    link("/compare", "Compare"), link("/planner", "Planner"),
    link("/docs", "API")));
};
