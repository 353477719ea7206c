// The sweep list (live progress) and the create-sweep form.
"use strict";

const PAGE = 20;
let offset = 0;
let options = null;

function checkboxes(container, name, values, checked) {
  container.replaceChildren(...values.map((v) => GS.el("label", {},
    GS.el("input", { type: "checkbox", name, value: v, checked: checked.includes(v) }), " ", v)));
}

function fillSelect(select, values, selected) {
  select.replaceChildren(...values.map((v) => GS.el("option", { value: v, selected: v === selected }, v)));
}

function intList(text) {
  // Numbers where they parse; anything else is sent as typed so the API names the bad value.
  return text.split(/[\s,]+/).filter(Boolean).map((t) => (/^-?\d+$/.test(t) ? Number(t) : t));
}

function textList(text) {
  return text.split(/[\s,]+/).filter(Boolean);
}

function optionalInt(id) {
  const value = document.getElementById(id).value.trim();
  return value === "" ? null : Number(value);
}

function formBody() {
  const value = (id) => document.getElementById(id).value;
  const checkedValues = (name) => [...document.querySelectorAll(`input[name=${name}]:checked`)].map((i) => i.value);
  const model = { preset: value("preset") };
  if (optionalInt("num_layers") !== null) model.num_layers = optionalInt("num_layers");
  if (optionalInt("vocab_size") !== null) model.vocab_size = optionalInt("vocab_size");
  const layers = checkedValues("layers");
  return {
    name: value("name"), kinds: checkedValues("kinds"), frameworks: checkedValues("frameworks"),
    modes: checkedValues("modes"), layers, layouts: checkedValues("layouts"),
    kernels: checkedValues("kernels"),
    // the attention layers' CP modes mean something only for the hybrid decoder
    ...(layers.includes("hybrid") ? { attn_cps: checkedValues("attn_cps") } : {}),
    chips: intList(value("chips")), dp: intList(value("dp")), seq_lens: intList(value("seq_lens")), model,
    batch_size: Number(value("batch_size")), dtypes: checkedValues("dtypes"),
    param_shardings: checkedValues("param_shardings"), remats: checkedValues("remats"),
    documents: textList(value("documents")),
    steps: Number(value("steps")),
    warmup_steps: Number(value("warmup_steps")),
    accelerator: { kind: value("accelerator_kind"), type: value("accelerator_type") },
    verify: document.getElementById("verify").checked,
    profile: document.getElementById("profile").checked,
    trial_timeout_s: Number(value("trial_timeout_s")),
    repeats: Number(value("repeats")),
  };
}

// The (chips, dp) meshes of the form (SweepSpec.meshes): each chip count with each dp that
// divides it.
function meshes(b) {
  const chips = [...new Set(b.chips)], dps = [...new Set(b.dp)];
  return chips.flatMap((c) => dps.filter((d) => Number.isInteger(c) && Number.isInteger(d) && d > 0 && c % d === 0)
                                 .map((d) => [c, d]));
}

// Trials the API will create (SweepSpec.grid_size): a mesh of one chip per replica (chips = 1,
// the one-chip baseline, or chips = dp, pure data parallel) runs once as mode none, not once
// per mode; every measured point runs `repeats` times, a plan (JAX's reference step only) once.
function showGridSize() {
  const b = formBody();
  const all = meshes(b), once = all.filter(([c, d]) => c === d).length;
  // per decoder: modes × attention CP modes (hybrid only) × layouts × meshes with CP
  const points = b.layers.reduce((total, layers) => total + b.modes.length *
    (layers === "hybrid" ? b.attn_cps.length : 1) * b.layouts.length * (all.length - once) + once, 0);
  const settings = (frameworks, kernels) => [frameworks, kernels, b.seq_lens, b.dtypes, b.param_shardings,
                                             b.remats, [...new Set(b.documents)]]
    .reduce((product, values) => product * values.length, 1);
  const n = b.kinds.reduce((total, kind) => total + (kind === "plan"
    ? settings(b.frameworks.filter((f) => f === "jax"), b.kernels.filter((k) => k === "reference"))
    : (b.repeats || 1) * settings(b.frameworks, b.kernels)) * points, 0);
  document.getElementById("grid-size").textContent =
    `${n} trial${n === 1 ? "" : "s"} (cap ${options ? options.grid_cap : "?"})`;
}

async function submit(event) {
  event.preventDefault();
  const errors = document.getElementById("create-errors");
  const button = document.getElementById("create-submit");
  errors.textContent = "";
  if (options && options.auth_required) GS.setToken(document.getElementById("token").value);
  button.disabled = true;
  try {
    const created = await GS.api("/api/sweeps", { method: "POST", body: formBody() });
    window.location.href = "/sweeps/" + Number(created.id);
  } catch (err) {
    errors.textContent = err.message;
  } finally {
    button.disabled = false;
  }
}

function sweepRow(s) {
  const c = s.counts;
  return GS.el("tr", { "data-sweep-id": s.id, "data-status": s.status },
    GS.el("td", { class: "num" }, s.id),
    GS.el("td", { class: "name", title: s.name }, GS.el("a", { href: "/sweeps/" + Number(s.id), class: "sweep-name" }, s.name)),
    GS.el("td", {}, GS.badge(s.status)),
    GS.el("td", {}, GS.progress(s.trials_done, s.trials_total)),
    GS.el("td", { class: "num" }, `${s.trials_done} / ${s.trials_total}`),
    GS.el("td", { class: "num" }, c.succeeded),
    GS.el("td", { class: "num" }, `${c.failed} · ${c.oom} · ${c.timeout}`),
    GS.el("td", { class: "num" }, c.skipped),
    GS.el("td", { class: "num" }, c.cancelled),
    GS.el("td", {}, GS.time(s.created_at)),
    GS.el("td", { class: "timing" }, Timing.elapsed(s, Date.now())));
}

async function refresh() {
  try {
    const page = await GS.api(`/api/sweeps?offset=${offset}&limit=${PAGE}`);
    document.querySelector("#sweeps tbody").replaceChildren(...page.data.map(sweepRow));
    document.getElementById("page-info").textContent =
      page.count ? `${offset + 1}–${offset + page.data.length} of ${page.count}` : "no sweeps yet";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + PAGE >= page.count;
  } catch (err) {
    document.getElementById("page-info").textContent = "cannot load sweeps: " + err.message;
  }
}

async function init() {
  GS.header("/");
  options = await GS.api("/api/options");
  checkboxes(document.getElementById("kinds"), "kinds", options.kinds, ["measure"]);
  checkboxes(document.getElementById("frameworks"), "frameworks", options.frameworks, options.frameworks);
  checkboxes(document.getElementById("modes"), "modes", options.modes, ["all_gather", "p2p"]);
  checkboxes(document.getElementById("layers"), "layers", options.layers, ["gdn_only"]);
  checkboxes(document.getElementById("attn_cps"), "attn_cps", options.attn_cps, ["all_gather_kv"]);
  checkboxes(document.getElementById("layouts"), "layouts", options.layouts, ["contiguous"]);
  checkboxes(document.getElementById("kernels"), "kernels", options.kernels || ["reference"], ["reference"]);
  fillSelect(document.getElementById("preset"), options.presets, "tiny");
  checkboxes(document.getElementById("dtypes"), "dtypes", options.dtypes, ["float32"]);
  checkboxes(document.getElementById("param_shardings"), "param_shardings", options.param_shardings, ["replicated"]);
  checkboxes(document.getElementById("remats"), "remats", options.remats, ["none"]);
  fillSelect(document.getElementById("accelerator_kind"), options.accelerator_kinds, "cpu");
  fillSelect(document.getElementById("accelerator_type"), options.accelerator_types, "cpu");
  document.getElementById("token-box").hidden = !options.auth_required;
  document.getElementById("token").value = GS.token();
  const form = document.getElementById("create-form");
  form.addEventListener("submit", submit);
  form.addEventListener("input", showGridSize);
  showGridSize();
  document.getElementById("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); refresh(); });
  document.getElementById("next").addEventListener("click", () => { offset += PAGE; refresh(); });
  await refresh();
  setInterval(refresh, 2000);
}

init();
