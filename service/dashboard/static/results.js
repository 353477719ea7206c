// Results across sweeps with the API's filters, sorting, paging and a CSV link.
"use strict";

const PAGE = 100;
let offset = 0;

function fillSelect(id, values, anyLabel) {
  const select = document.getElementById(id);
  const opts = values.map((v) => GS.el("option", { value: v }, v));
  if (anyLabel) opts.unshift(GS.el("option", { value: "" }, anyLabel));
  select.replaceChildren(...opts);
}

function params() {
  const p = new URLSearchParams();
  for (const name of ["preset", "framework", "mode", "accelerator", "dtype", "param_sharding", "remat",
                      "repeat", "seq_len_min", "seq_len_max"]) {
    const value = document.getElementById("f-" + name).value.trim();
    if (value) p.set(name, value);
  }
  for (const chips of document.getElementById("f-chips").value.split(/[\s,]+/).filter(Boolean)) {
    p.append("chips", chips);
  }
  const sort = document.getElementById("f-sort").value;
  p.set("sort", (document.getElementById("f-desc").checked ? "-" : "") + sort);
  return p;
}

function resultRow(t) {
  const num = (v, title) => GS.el("td", { class: "num", title: title || null }, v);
  return GS.el("tr", { "data-trial-id": t.id },
    num(t.id), GS.el("td", {}, GS.el("a", { href: "/sweeps/" + Number(t.sweep_id) }, t.sweep_id)),
    GS.el("td", {}, t.preset), GS.el("td", {}, t.framework), GS.el("td", {}, t.mode), num(t.chips),
    num(t.seq_len), num(t.batch_size), GS.el("td", {}, t.dtype), GS.el("td", {}, t.param_sharding),
    GS.el("td", {}, t.remat), num(t.repeat), GS.el("td", {}, t.accelerator),
    GS.el("td", {}, t.device_name || ""), GS.attempts(t),
    num(GS.num(t.tokens_per_s_per_chip)),
    num(GS.pct(t.scaling_efficiency), t.baseline_key ? "baseline: " + t.baseline_key : null),
    num(GS.stepTime(t)), num(GS.num(t.compile_time_s)), num(GS.pct(t.mfu)), num(GS.pct(t.hfu)),
    num(GS.bytes(t.peak_memory_bytes_per_chip), t.memory_source),
    num(GS.bytes(t.estimated_memory_bytes_per_chip), t.estimated_memory_source),
    num(GS.bytes(t.predicted_memory_bytes_per_chip)),
    num(GS.bytes(t.cp_comm_bytes_per_step_per_chip)),
    num(GS.bytes(t.grad_sync_bytes_per_step_per_chip)), GS.el("td", {}, GS.time(t.finished_at)));
}

async function load() {
  const p = params();
  const csv = new URLSearchParams(p);
  csv.set("format", "csv");
  document.getElementById("csv").href = "/api/results?" + csv.toString();
  p.set("offset", offset);
  p.set("limit", PAGE);
  const errors = document.getElementById("results-errors");
  errors.textContent = "";
  try {
    const page = await GS.api("/api/results?" + p.toString());
    document.querySelector("#results tbody").replaceChildren(...page.data.map(resultRow));
    document.getElementById("page-info").textContent =
      page.count ? `${offset + 1}–${offset + page.data.length} of ${page.count}` : "no matching results";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + PAGE >= page.count;
  } catch (err) {
    errors.textContent = err.message;
  }
}

async function init() {
  GS.header("/results");
  const o = await GS.api("/api/options");
  fillSelect("f-preset", o.presets, "any");
  fillSelect("f-framework", o.frameworks, "any");
  fillSelect("f-mode", o.trial_modes, "any");
  fillSelect("f-accelerator", o.accelerator_types, "any");
  fillSelect("f-dtype", o.dtypes, "any");
  fillSelect("f-param_sharding", o.param_shardings, "any");
  fillSelect("f-remat", o.remats, "any");
  fillSelect("f-sort", o.result_sort_fields);
  document.getElementById("filters").addEventListener("submit", (e) => { e.preventDefault(); offset = 0; load(); });
  document.getElementById("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); load(); });
  document.getElementById("next").addEventListener("click", () => { offset += PAGE; load(); });
  load();
}

init();
