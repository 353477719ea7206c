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
  if (method !== "GET" && GS.token()) headers.Authorization = "Bearer " + GS.token();
  const res = await fetch(path, {
    method, headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
  });
  const text = await res.text();
  let data = text;
  try { data = text ? JSON.parse(text) : null; } catch (e) { /* keep the text */ }
  if (!res.ok) {
    const err = new Error(GS.errorText(res.status, data));
    err.status = res.status;
    throw err;
  }
  return data;
};

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

GS.num = function (value, digits = 3) {
  if (value === null || value === undefined) return "";
  if (Math.abs(value) >= 1e5 || (Math.abs(value) < 1e-3 && value !== 0)) {
    return Number(value).toExponential(digits - 1);
  }
  return Number(value).toPrecision(digits).replace(/\.?0+$/, "");
};

GS.bytes = function (value) {
  if (value === null || value === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(value), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return v.toFixed(v >= 100 || i === 0 ? 0 : 1) + " " + units[i];
};

GS.pct = (value) => (value === null || value === undefined ? "" : (100 * value).toFixed(2) + "%");

GS.time = (iso) => (iso ? new Date(iso).toLocaleString() : "");

// "median (fastest–slowest) ×n" of a trial's measured steps.
GS.stepTime = function (t) {
  if (t.step_time_s === null || t.step_time_s === undefined) return "";
  const spread = t.step_time_min_s === null || t.step_time_min_s === undefined ? "" :
    ` (${GS.num(t.step_time_min_s)}–${GS.num(t.step_time_max_s)})`;
  return GS.num(t.step_time_s) + spread + (t.measured_steps ? ` ×${t.measured_steps}` : "");
};

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

GS.header = function (active) {
  const link = (href, text) => GS.el("a", { href, style: active === href ? "font-weight:600" : null },
                                     text);
  document.body.prepend(GS.el("header", {}, GS.el("span", { class: "brand" }, "gdn-sweep"),
    link("/", "Sweeps"), link("/results", "Results"), link("/docs", "API")));
};
