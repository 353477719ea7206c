// Results across sweeps with the API's filters, sorting, paging and a CSV link. The filters
// live in the query string (read on load, written back on every change), so a link
// reproduces the view; list filters repeat as the API takes them (`chips=2&chips=4`).
"use strict";

const PAGE = 100;
let offset = 0;
const DEFAULT_SORT = "-tokens_per_s_per_chip";  // the API's: left out of the link

const SELECTS = ["status", "kind", "preset", "framework", "mode", "accelerator", "dtype", "param_sharding", "remat",
                 "layers", "attn_cp", "layout", "kernels"];
const LISTS = ["chips", "dp", "documents", "repeat"];  // comma-separated in the form
const NUMBERS = ["seq_len_min", "seq_len_max", "sweep_id"];
const FORM_PARAMS = new Set([...SELECTS, ...LISTS, ...NUMBERS, "sort", "offset"]);
const NOT_KEPT = new Set(["limit", "format"]);
const STATUSES = ["succeeded", "failed", "oom", "timeout", "skipped", "cancelled"];  // the API's
let extra = [];  // parameters of the link the form has no field for, kept as they came

function fillSelect(id, values, anyLabel) {
  const select = document.getElementById(id);
  const opts = values.map((v) => GS.el("option", { value: v }, v));
  if (anyLabel) opts.unshift(GS.el("option", { value: "" }, anyLabel));
  select.replaceChildren(...opts);
}

// Select `values` (several: "any of them"); a value the form does not offer is added, so
// the API's answer names it rather than the form dropping it.
function choose(select, values) {
  const value = values.join(",");
  if (![...select.options].some((o) => o.value === value)) {
    select.append(GS.el("option", { value }, values.join(" or ")));
  }
  select.value = value;
}

const field = (name) => document.getElementById("f-" + name);
const splitList = (text) => text.split(/[\s,]+/).filter(Boolean);

function readQuery(query) {
  for (const name of SELECTS) if (query.getAll(name).length) choose(field(name), query.getAll(name));
  for (const name of LISTS) field(name).value = query.getAll(name).join(", ");
  for (const name of NUMBERS) field(name).value = query.get(name) || "";
  const sort = query.get("sort");
  if (sort) {
    field("desc").checked = sort.startsWith("-");
    choose(field("sort"), [sort.replace(/^-/, "")]);
  }
  offset = Math.max(0, Number(query.get("offset")) || 0);
  extra = [...query.entries()].filter(([name]) => !FORM_PARAMS.has(name) && !NOT_KEPT.has(name));
  document.getElementById("extra-filters").textContent = extra.length ?
    "also filtered by the link: " + extra.map(([k, v]) => `${k}=${v}`).join(" · ") : "";
}

function params() {
  const p = new URLSearchParams();
  for (const name of SELECTS) for (const v of splitList(field(name).value)) p.append(name, v);
  for (const name of LISTS) for (const v of splitList(field(name).value)) p.append(name, v);
  for (const name of NUMBERS) if (field(name).value.trim()) p.set(name, field(name).value.trim());
  for (const [name, value] of extra) p.append(name, value);
  const sort = (field("desc").checked ? "-" : "") + field("sort").value;
  if (sort !== DEFAULT_SORT) p.set("sort", sort);
  return p;
}

// What a reader came for first (the outcome or why not, the speed, memory), then what the
// trial was, then the rest.
function resultRow(t) {
  const num = (v, title) => GS.el("td", { class: "num", title: title || null }, v);
  const speed = (text, title) => num(GS.speed(t, text), GS.interpreted(t) ? GS.INTERPRETED_TITLE : title);
  return GS.el("tr", { "data-trial-id": t.id, "data-status": t.status },
    num(t.id), GS.el("td", {}, GS.badge(t.status)), GS.reasonCell(t),
    speed(GS.num(t.tokens_per_s_per_chip)), speed(GS.pct(t.mfu)), speed(GS.stepTime(t)),
    num(GS.bytes(t.peak_memory_bytes_per_chip), t.memory_source),
    GS.el("td", {}, GS.el("a", { href: "/sweeps/" + Number(t.sweep_id) }, t.sweep_id)),
    GS.el("td", {}, t.framework), GS.el("td", {}, t.mode), num(t.chips), num(t.dp || 1),
    num(GS.num(t.seq_len, 21)), GS.el("td", {}, GS.kernelsLabel(t)), GS.el("td", {}, t.layers),
    GS.el("td", {}, t.attn_cp || ""), GS.el("td", {}, t.layout),
    GS.el("td", {}, t.documents || "single"), GS.el("td", {}, t.dtype),
    GS.el("td", {}, t.param_sharding), GS.el("td", {}, t.remat),
    num(t.batch_size), num(t.global_batch_size || t.batch_size),
    GS.el("td", {}, t.preset), GS.el("td", {}, t.kind || ""),
    speed(GS.pct(t.scaling_efficiency), t.baseline_key ? "baseline: " + t.baseline_key : null),
    GS.compileCell(t), speed(GS.pct(t.hfu)),
    num(GS.bytes(t.estimated_memory_bytes_per_chip), t.estimated_memory_source),
    num(GS.bytes(t.predicted_memory_bytes_per_chip)),
    num(GS.bytes(t.cp_comm_bytes_per_step_per_chip)),
    num(GS.bytes(t.grad_sync_bytes_per_step_per_chip)),
    GS.el("td", {}, t.gdn_kernel || ""), GS.el("td", {}, t.attention_kernel || ""),
    num(t.repeat), GS.el("td", {}, t.accelerator), GS.el("td", {}, t.device_name || ""),
    GS.attempts(t), GS.el("td", {}, GS.time(t.finished_at)));
}

async function load() {
  const p = params();
  const csv = new URLSearchParams(p);
  csv.set("format", "csv");
  document.getElementById("csv").href = "/api/results?" + csv.toString();
  if (offset) p.set("offset", offset);
  const shown = p.toString();
  window.history.replaceState(null, "", window.location.pathname + (shown ? "?" + shown : ""));
  p.set("limit", PAGE);
  const errors = document.getElementById("results-errors");
  errors.textContent = "";
  try {
    const page = await GS.api("/api/results?" + p.toString());
    document.querySelector("#results tbody").replaceChildren(...page.data.map(resultRow));
    document.getElementById("page-info").textContent = page.count ?
      `${GS.num(offset + 1, 21)}–${GS.num(offset + page.data.length, 21)} of ${GS.num(page.count, 21)}` :
      "no matching results";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + PAGE >= page.count;
  } catch (err) {
    errors.textContent = err.message;
  }
}

async function init() {
  GS.header("/results");
  const o = await GS.api("/api/options");
  const failed = STATUSES.filter((v) => v !== "succeeded");
  fillSelect("f-status", STATUSES, "succeeded (default)");
  field("status").append(GS.el("option", { value: failed.join(",") }, "did not succeed (why: the reason column)"),
                         GS.el("option", { value: STATUSES.join(",") }, "any"));
  const kinds = o.kinds || ["measure"];
  fillSelect("f-kind", kinds, "measure (default)");
  if (kinds.length > 1) field("kind").append(GS.el("option", { value: kinds.join(",") }, "any"));
  fillSelect("f-preset", o.presets, "any");
  fillSelect("f-framework", o.frameworks, "any");
  fillSelect("f-mode", o.trial_modes, "any");
  fillSelect("f-accelerator", o.accelerator_types, "any");
  fillSelect("f-dtype", o.dtypes, "any");
  fillSelect("f-param_sharding", o.param_shardings, "any");
  fillSelect("f-remat", o.remats, "any");
  fillSelect("f-layers", o.layers, "any");
  fillSelect("f-attn_cp", o.attn_cps, "any");
  fillSelect("f-layout", o.layouts, "any");
  fillSelect("f-kernels", o.kernels || ["reference"], "any");
  fillSelect("f-sort", o.result_sort_fields);
  choose(field("sort"), [DEFAULT_SORT.slice(1)]);
  readQuery(new URLSearchParams(window.location.search));
  document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); offset = 0; load(); });
  document.getElementById("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); load(); });
  document.getElementById("next").addEventListener("click", () => { offset += PAGE; load(); });
  load();
}

init();
