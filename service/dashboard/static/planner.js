// The capacity planner page: the form, kept in the URL under GET /api/capacity's own parameter
// names (so /planner?… and /api/capacity?… are the same question), the request, and the
// API's 422 shown beside the field it names. Opened without a question, the form starts from
// the stored trials' settings (GET /api/capacity/defaults) and asks it, so the first answer
// is one the trials can give. Drawing the answer is planner-answer.js's job.
"use strict";

const Planner = {};
Planner.GIB = 2 ** 30;
Planner.SCALARS = ["preset", "seq_len", "accelerator", "max_chips", "batch_size", "dtype",
                   "kernels", "num_layers"];
Planner.LISTS = ["frameworks", "layers", "attn_cps", "layouts"];  // checkbox fieldsets
Planner.FORM_KEYS = new Set([...Planner.SCALARS, "chip_memory_bytes", ...Planner.LISTS]);
Planner.asked = 0;  // the latest request's number: a slower earlier answer is dropped

Planner.field = (name) => document.getElementById("f-" + name);

Planner.fillSelect = function (select, values, blank) {
  select.replaceChildren(...(blank ? [GS.el("option", { value: "" }, blank)] : []),
                         ...values.map((v) => GS.el("option", { value: v }, v)));
};

// A value the link carries but the form does not offer (accelerator=h900) stays selected, so
// the API, not the page, says what is wrong with it.
Planner.select = function (select, value) {
  if (value && ![...select.options].some((o) => o.value === value)) {
    select.append(GS.el("option", { value }, value + " (not offered)"));
  }
  select.value = value || "";
};

Planner.toForm = function (params) {
  for (const name of Planner.SCALARS) {
    const input = Planner.field(name), value = params.get(name) || "";
    if (input.tagName === "SELECT") Planner.select(input, value); else input.value = value;
  }
  const bytes = params.get("chip_memory_bytes");
  Planner.field("chip_memory_gib").value =
    bytes === null || bytes === "" ? "" : (/^[0-9]+$/.test(bytes) ? Number(bytes) / Planner.GIB : bytes);
  for (const list of Planner.LISTS) {
    const values = params.getAll(list);
    for (const box of Planner.field(list).querySelectorAll("input")) box.checked = values.includes(box.value);
  }
};

Planner.checkboxes = (name, values) => Planner.field(name).replaceChildren(...values.map((v) =>
  GS.el("label", {}, GS.el("input", { type: "checkbox", name, value: v }), " " + v)));

// The query of the form's values, plus what the link holds that the form has no field for
// (modes, param_shardings, remats, sweep_id): those travel on unchanged.
Planner.fromForm = function () {
  const query = new URLSearchParams();
  for (const name of Planner.SCALARS) {
    const value = Planner.field(name).value.trim();
    if (value !== "") query.append(name, value);
  }
  const gib = Planner.field("chip_memory_gib").value.trim();
  if (gib !== "") {
    query.append("chip_memory_bytes", Number.isFinite(Number(gib)) ? String(Math.round(Number(gib) * Planner.GIB)) : gib);
  }
  for (const list of Planner.LISTS) {
    for (const box of Planner.field(list).querySelectorAll("input:checked")) query.append(list, box.value);
  }
  for (const [key, value] of new URLSearchParams(window.location.search)) {
    if (!Planner.FORM_KEYS.has(key)) query.append(key, value);
  }
  return query;
};

Planner.showPassthrough = function (query) {
  const extra = [...query].filter(([key]) => !Planner.FORM_KEYS.has(key));
  const note = document.getElementById("passthrough");
  note.hidden = !extra.length;
  note.textContent = extra.length ? "Also asked, from the link: " +
    extra.map(([k, v]) => `${k}=${v}`).join(", ") : "";
};

// ---------------------------------------------------------------- errors

Planner.clearErrors = function () {
  for (const slot of document.querySelectorAll(".field-error")) slot.textContent = "";
  for (const input of document.querySelectorAll(".invalid")) {
    input.classList.remove("invalid");
    input.removeAttribute("aria-invalid");
  }
  document.getElementById("plan-errors").textContent = "";
};

// A 422's messages beside the fields they name (loc = ["query", field, index?]); the rest,
// and any other failure, in the box under the form: never a blank page.
Planner.showErrors = function (status, data) {
  const general = [];
  if (status === 422 && data && Array.isArray(data.detail)) {
    for (const d of data.detail) {
      const name = (d.loc || [])[1], msg = String(d.msg || "").replace(/^Value error, /, "");
      const slot = name ? document.getElementById("e-" + name) : null;
      if (!slot) { general.push(`${name || "request"}: ${msg}`); continue; }
      slot.textContent = (slot.textContent ? slot.textContent + "\n" : "") + msg;
      const input = name === "chip_memory_bytes" ? Planner.field("chip_memory_gib") : Planner.field(name);
      if (input) { input.classList.add("invalid"); input.setAttribute("aria-invalid", "true"); }
    }
  } else {
    general.push(GS.errorText(status, data));
  }
  document.getElementById("plan-errors").textContent = general.join("\n");
};

// ---------------------------------------------------------------- asking

Planner.ask = async function (query) {
  const number = (Planner.asked += 1);
  const status = document.getElementById("plan-status"), apiLink = document.getElementById("api-link");
  Planner.clearErrors();
  Planner.showPassthrough(query);
  window.history.replaceState(null, "", window.location.pathname + "?" + query);
  apiLink.href = "/api/capacity?" + query;
  apiLink.hidden = false;
  status.textContent = "planning…";
  document.body.dataset.plannerState = "asking";
  let res, data;
  try {
    res = await fetch("/api/capacity?" + query, { headers: { Accept: "application/json" } });
    const text = await res.text();
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
  } catch (err) {
    res = { ok: false, status: 0 };
    data = "the service did not answer: " + err.message;
  }
  if (number !== Planner.asked) return;
  status.textContent = "";
  if (!res.ok) {
    PlannerAnswer.hide();
    Planner.showErrors(res.status, data);
    document.body.dataset.plannerState = "error";
    return;
  }
  Planner.toForm(Planner.echo(data.request));
  PlannerAnswer.draw(data);
  Planner.hintFromTrials(data);
  document.body.dataset.plannerState = "answered";
};

// The settings the API used (its defaults filled in), as form parameters.
Planner.echo = function (request) {
  const params = new URLSearchParams();
  for (const name of Planner.SCALARS) {
    if (request[name] !== null && request[name] !== undefined) params.set(name, String(request[name]));
  }
  if (request.chip_memory_bytes !== null) params.set("chip_memory_bytes", String(request.chip_memory_bytes));
  for (const list of Planner.LISTS) (request[list] || []).forEach((v) => params.append(list, v));
  return params;
};

// Where no candidate has a speed and the request differs from what the stored trials ran, say
// so beside the refusal, with a link to the question they answer.
Planner.hintFromTrials = function (answer) {
  const slot = document.getElementById("no-speed"), d = Planner.formDefaults;
  if (slot.hidden || !d || !d.preset) return;
  const r = answer.request, differs = [];
  for (const key of ["preset", "accelerator", "dtype", "kernels"]) {
    if (d[key] && r[key] !== d[key]) differs.push(`${key} ${d[key]} (asked: ${r[key]})`);
  }
  if (d.frameworks.some((f) => !r.frameworks.includes(f))) {
    differs.push(`frameworks ${d.frameworks.join(", ")} (asked: ${r.frameworks.join(", ")})`);
  }
  if (!differs.length) return;
  slot.append(" The stored trials ran ", differs.join(", "), ": ",
              GS.el("a", { id: "plan-as-trials", href: "/planner?" + Planner.defaultsQuery(d) },
                    "plan with their settings"), ".");
};

// The stored trials' settings (GET /api/capacity/defaults) as the form's parameters.
Planner.defaultsQuery = function (defaults) {
  const params = new URLSearchParams();
  for (const name of Planner.SCALARS) {
    if (defaults[name] !== null && defaults[name] !== undefined) params.set(name, String(defaults[name]));
  }
  for (const list of Planner.LISTS) (defaults[list] || []).forEach((v) => params.append(list, v));
  return params;
};

Planner.start = async function () {
  GS.header("/planner");
  const planForm = document.getElementById("plan-form");
  let form;
  try {
    const options = await GS.api("/api/options");
    Planner.fillSelect(Planner.field("preset"), options.presets, "— choose a preset —");
    Planner.fillSelect(Planner.field("accelerator"), options.accelerator_types, "— choose a chip type —");
    Planner.fillSelect(Planner.field("dtype"), options.dtypes, "the API's default");
    Planner.fillSelect(Planner.field("kernels"), options.kernels, "the API's default");
    Planner.checkboxes("frameworks", options.frameworks);
    form = await GS.api("/api/capacity/defaults");
    Planner.formDefaults = form.defaults;
    for (const list of ["layers", "attn_cps", "layouts"]) Planner.checkboxes(list, form[list]);
  } catch (err) {
    document.getElementById("plan-errors").textContent = "cannot load the form's options: " + err.message;
    return;
  }
  let params = new URLSearchParams(window.location.search);
  const asked = [...params].length > 0;
  if (!asked && form.defaults.preset) params = Planner.defaultsQuery(form.defaults);
  const source = document.getElementById("form-source");
  source.hidden = asked || !form.defaults.preset;
  source.textContent = source.hidden ? "" : `Started from ${form.source}.`;
  Planner.toForm(params);
  planForm.addEventListener("submit", (event) => {
    event.preventDefault();
    Planner.ask(Planner.fromForm());
  });
  if ([...params].length) Planner.ask(Planner.fromForm());
  else document.getElementById("plan-status").textContent =
    "Choose a preset, a length and a chip type, then Plan.";
};

Planner.start();
