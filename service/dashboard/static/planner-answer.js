// The capacity planner's answer (GET /api/capacity) drawn: the three picks as cards, the
// candidates as tables (those that do not fit behind a toggle), chips vs tokens/s with the
// Pareto frontier, the caveats. Every figure carries its basis as a badge, its note and trials
// as the tooltip; cells keep the API's raw value in data-value. Where no candidate has a speed,
// the page says why (the refusals' most common reason); roofline figures name the efficiency
// they assume (answer.speed_basis).
"use strict";

const PlannerAnswer = {};

PlannerAnswer.BASIS_LABEL = { measured: "measured", estimated: "est.", interpolated: "interp.",
                              extrapolated: "extrap.", predicted: "pred.", roofline: "roofline",
                              refused: "refused" };
PlannerAnswer.FIGURES = [
  ["memory_bytes_per_chip", "memory/chip", GS.bytes],
  ["tokens_per_s_per_chip", "tokens/s/chip", GS.num],
  ["chip_hours_per_billion_tokens", "chip-hours/10⁹ tokens", GS.num],
  ["tokens_per_s", "total tokens/s", GS.num],
  ["mfu", "MFU", GS.pct],
  ["comm_bytes_per_step_per_chip", "comm/step/chip", GS.bytes],
  ["step_time_s", "step time", GS.seconds],
];
PlannerAnswer.PICKS = [
  ["fewest_chips", "Fewest chips that fit"],
  ["cheapest", "Fewest chip-hours per token"],
  ["fastest", "Fastest within the budget"],
];
// Measured points filled, everything the fits made up open, so the two never look alike.
PlannerAnswer.MARKERS = {
  measured: { symbol: "circle", name: "measured (a trial of this point)" },
  estimated: { symbol: "triangle-up-open", name: "estimated (a plan's compile)" },
  interpolated: { symbol: "circle-open", name: "interpolated (fitted, inside the trials' range)" },
  extrapolated: { symbol: "diamond-open", name: "extrapolated (fitted, beyond the trials' range)" },
  predicted: { symbol: "square-open", name: "predicted (analytic model alone)" },
  roofline: { symbol: "star-open", name: "roofline (no trial: at the stated efficiency)" },
};
PlannerAnswer.SECTIONS = ["answer-summary", "pareto-section", "candidates-section", "caveats-section"];

PlannerAnswer.hide = function () {
  for (const id of PlannerAnswer.SECTIONS) document.getElementById(id).hidden = true;
};

PlannerAnswer.mesh = (c) => `${c.dp}×${c.cp_chips}`;

// "p2p", "p2p · ring · zigzag" (the hybrid's attention CP and a zigzag layout), "no CP".
PlannerAnswer.split = (c) => (c.mode === "none" ? "no CP"
  : [c.mode, c.attn_cp, c.layout === "zigzag" ? "zigzag" : null].filter(Boolean).join(" · "));

PlannerAnswer.settings = (c) => `${c.framework} · ${c.layers} · ${PlannerAnswer.split(c)} · ` +
  `${c.chips} chip${c.chips === 1 ? "" : "s"}` + (c.dp > 1 ? ` (dp×cp ${PlannerAnswer.mesh(c)})` : "") +
  ` · ${c.param_sharding} · remat ${c.remat}` +
  (c.gdn_kernel ? ` · GDN: ${c.gdn_kernel}` + (c.gdn_kernel_unmeasured ? " (speed unmeasured)" : "") : "");

// JAX's fused GDN (the Pallas chunk rule) before any measured trial of it: its step time (and
// what follows from it) is a prior or the roofline, never a measurement of the kernel.
PlannerAnswer.UNMEASURED_TITLE = "no measured (non-interpreted) trial of this GDN kernel yet: " +
  "the step time is the prior's or the roofline's";
PlannerAnswer.unmeasured = (c, field) => (c.gdn_kernel_unmeasured && field === "step_time_s"
  ? GS.el("span", { class: "basis b-unmeasured", title: PlannerAnswer.UNMEASURED_TITLE }, "unmeasured")
  : null);

PlannerAnswer.tooltip = (f) => [f.basis + (f.note ? ": " + f.note : ""),
  f.trial_ids.length ? "trials " + f.trial_ids.join(", ") : ""].filter(Boolean).join("\n");

// A figure with no value that was not refused (an MFU without a known peak) is "unknown": its
// basis is the step time's, which would otherwise read as a measured blank.
PlannerAnswer.badge = (f) => (f.value === null && f.basis !== "refused"
  ? GS.el("span", { class: "basis b-unknown" }, "unknown")
  : GS.el("span", { class: "basis b-" + f.basis }, PlannerAnswer.BASIS_LABEL[f.basis] || f.basis));

PlannerAnswer.value = (figure, format) => (figure.value === null ? "—" : format(figure.value));

PlannerAnswer.trialLinks = (ids, most = 6) => GS.el("span", { class: "trial-links" },
  ids.slice(0, most).map((id) => GS.el("a", { href: "/api/trials/" + id, title: "trial " + id + " (API)" }, "#" + id)),
  ids.length > most ? ` +${ids.length - most}` : null);

// ---------------------------------------------------------------- picks

// Why no fitting candidate has a step time: the most common refusal among them.
PlannerAnswer.whyNoSpeed = function (fitting) {
  const counts = new Map();
  for (const c of fitting) {
    if (c.step_time_s.value === null) counts.set(c.step_time_s.note, (counts.get(c.step_time_s.note) || 0) + 1);
  }
  if (!counts.size) return "";
  const [note, count] = [...counts].sort((a, b) => b[1] - a[1])[0];
  return `No candidate that fits has a step time (${count} of ${fitting.length}): ${note}`;
};

PlannerAnswer.card = function (key, title, c, anyFits, whyNoSpeed) {
  if (!c) {
    const why = key === "fewest_chips" || !anyFits ? "No candidate fits the chip's memory within the budget."
      : whyNoSpeed || "No candidate that fits has a throughput the planner will stand behind.";
    return GS.el("div", { class: "pick none", "data-pick": key }, GS.el("h3", {}, title), GS.el("p", { class: "muted" }, why));
  }
  const rows = PlannerAnswer.FIGURES.map(([field, label, format]) => {
    const f = c[field];
    return [GS.el("dt", {}, label), GS.el("dd", { title: PlannerAnswer.tooltip(f), "data-figure": field },
      PlannerAnswer.value(f, format), " ", PlannerAnswer.badge(f), PlannerAnswer.unmeasured(c, field),
      PlannerAnswer.trialLinks(f.trial_ids))];
  });
  return GS.el("div", { class: "pick", "data-pick": key, "data-framework": c.framework, "data-mode": c.mode,
                        "data-layers": c.layers, "data-attn-cp": c.attn_cp || "", "data-layout": c.layout,
                        "data-chips": c.chips, "data-dp": c.dp, "data-param-sharding": c.param_sharding, "data-remat": c.remat },
    GS.el("h3", {}, title), GS.el("p", { class: "config" }, PlannerAnswer.settings(c)),
    GS.el("dl", {}, rows.flat(),
          GS.el("dt", {}, "of chip memory"), GS.el("dd", {}, GS.bytes(c.chip_memory_bytes))));
};

// ---------------------------------------------------------------- tables

// The framework column only when the request compares frameworks (it is in the summary else).
PlannerAnswer.table = function (table, candidates, frameworks) {
  const heads = [...(frameworks > 1 ? ["framework"] : []), "decoder", "mode · attn CP · layout", "chips", "dp × cp",
                 "param sharding", "remat",
                 ...PlannerAnswer.FIGURES.map(([, label]) => label), "chip memory"];
  const row = (c) => GS.el("tr", { "data-framework": c.framework, "data-mode": c.mode, "data-chips": c.chips,
                                   "data-dp": c.dp, "data-param-sharding": c.param_sharding, "data-remat": c.remat,
                                   "data-layers": c.layers, "data-attn-cp": c.attn_cp || "", "data-layout": c.layout },
    frameworks > 1 ? GS.el("td", {}, c.framework) : null, GS.el("td", {}, c.layers),
    GS.el("td", { "data-split": "" }, PlannerAnswer.split(c)), GS.el("td", { class: "num" }, c.chips),
    GS.el("td", { class: "num", "data-mesh": "" }, PlannerAnswer.mesh(c)),
    GS.el("td", {}, c.param_sharding), GS.el("td", {}, c.remat),
    PlannerAnswer.FIGURES.map(([field, , format]) => {
      const f = c[field];
      return GS.el("td", { class: "num", title: PlannerAnswer.tooltip(f), "data-figure": field,
                           "data-value": f.value === null ? "" : f.value, "data-basis": f.basis },
                   PlannerAnswer.value(f, format), " ", PlannerAnswer.badge(f),
                   PlannerAnswer.unmeasured(c, field));
    }),
    GS.el("td", { class: "num" }, GS.bytes(c.chip_memory_bytes)));
  table.replaceChildren(GS.el("thead", {}, GS.el("tr", {}, heads.map((h) => GS.el("th", {}, h)))),
                        GS.el("tbody", {}, candidates.map(row)));
};

// ---------------------------------------------------------------- Pareto plot

// Points no other point beats: none has as few chips or fewer and as many tokens/s or more
// (ties: the first one kept). Sorted by chips, so tokens/s rises along it.
PlannerAnswer.frontier = function (points) {
  const sorted = [...points].sort((a, b) => a.x - b.x || b.y - a.y);
  const kept = [];
  for (const p of sorted) if (!kept.length || p.y > kept[kept.length - 1].y) kept.push(p);
  return kept;
};

PlannerAnswer.pareto = function (div, fitting) {
  const points = fitting.filter((c) => c.tokens_per_s.value !== null).map((c) => ({
    x: c.chips, y: c.tokens_per_s.value, basis: c.tokens_per_s.basis,
    text: `${PlannerAnswer.settings(c)}<br>${GS.num(c.tokens_per_s.value)} tokens/s (${c.tokens_per_s.basis})`,
  }));
  if (!points.length) {
    Plotly.purge(div);
    div.className = "plot no-data";
    div.replaceChildren(GS.el("p", {}, "No candidate that fits has a throughput to plot."));
    return;
  }
  div.className = "plot";
  div.replaceChildren();
  const traces = Object.entries(PlannerAnswer.MARKERS).map(([basis, marker]) => {
    const mine = points.filter((p) => p.basis === basis);
    return { type: "scatter", mode: "markers", name: marker.name, meta: { basis },
             x: mine.map((p) => p.x), y: mine.map((p) => p.y), text: mine.map((p) => p.text),
             hovertemplate: "%{text}<extra></extra>",
             marker: { symbol: marker.symbol, size: 11, color: "#2f6fdd", line: { width: 2, color: "#2f6fdd" } } };
  }).filter((t) => t.x.length);
  const front = PlannerAnswer.frontier(points);
  traces.push({ type: "scatter", mode: "lines", name: "Pareto frontier (nothing with ≤ chips is faster)",
                meta: { frontier: true }, x: front.map((p) => p.x), y: front.map((p) => p.y),
                line: { shape: "hv", color: "#d62728", width: 2 }, hoverinfo: "skip" });
  const chips = points.map((p) => p.x), top = Math.max(...chips);
  const ticks = [];
  for (let n = 1; n <= top; n *= 2) ticks.push(n);
  const layout = {
    height: 380, margin: { l: 70, r: 20, t: 10, b: 50 }, hovermode: "closest",
    legend: { orientation: "h", y: -0.2 },
    xaxis: { title: { text: "chips (log₂ scale)" }, type: "log", tickvals: ticks, ticktext: ticks.map(String),
             range: [Math.log10(Math.min(...chips) / 1.5), Math.log10(top * 1.5)] },
    yaxis: { title: { text: "total tokens/s" }, rangemode: "tozero", tickformat: "~s" },
  };
  Plotly.react(div, traces, layout, { responsive: true, displaylogo: false });
};

// ---------------------------------------------------------------- the whole answer

PlannerAnswer.draw = function (answer) {
  const fitting = answer.candidates.filter((c) => c.fits), over = answer.candidates.filter((c) => !c.fits);
  const r = answer.request;
  for (const id of PlannerAnswer.SECTIONS) document.getElementById(id).hidden = false;
  const decoders = [...new Set(answer.candidates.map((c) => c.layers))].join(", ") || (r.layers || []).join(", ");
  document.getElementById("summary").textContent =
    `${r.preset} (${decoders}; ${r.frameworks.join(", ")}) at ${GS.num(r.seq_len, 10)} tokens × batch ${r.batch_size}, ` +
    `${r.dtype}, ${r.kernels || "reference"} kernels, on ${r.accelerator} ` +
    `chips, up to ${GS.num(r.max_chips, 10)}: ${answer.candidates.length} candidates, ${fitting.length} fit. ` +
    `Evidence: ${answer.evidence_trials} trial${answer.evidence_trials === 1 ? "" : "s"}. ${answer.model_note}`;
  const nothing = document.getElementById("nothing-fits");
  nothing.hidden = fitting.length > 0;
  nothing.textContent = fitting.length ? "" : `Nothing fits: every candidate up to ${GS.num(r.max_chips, 10)} ` +
    "chips needs more memory per chip than the chip has. Raise the chip budget or choose a chip with " +
    "more memory (or, where the link narrows them, allow more remats and param shardings).";
  const whyNoSpeed = PlannerAnswer.whyNoSpeed(fitting);
  const noSpeed = document.getElementById("no-speed");
  noSpeed.hidden = !(fitting.length && fitting.every((c) => c.tokens_per_s.value === null));
  noSpeed.textContent = noSpeed.hidden ? "" : whyNoSpeed;
  const basis = document.getElementById("speed-basis");
  basis.hidden = !answer.speed_basis;
  basis.textContent = answer.speed_basis ? `Roofline figures (no trial answers them) assume ${answer.speed_basis.label}: ` +
    `${answer.speed_basis.source}.` : "";
  document.getElementById("picks").replaceChildren(
    ...PlannerAnswer.PICKS.map(([key, title]) => PlannerAnswer.card(key, title, answer[key], fitting.length > 0,
                                                                      whyNoSpeed)));
  document.getElementById("fitting-count").textContent = `(${fitting.length}, fastest first)`;
  PlannerAnswer.table(document.getElementById("fitting"), fitting, r.frameworks.length);
  document.getElementById("fitting").hidden = !fitting.length;
  const details = document.getElementById("not-fitting");
  details.hidden = !over.length;
  details.open = !fitting.length && over.length > 0;
  document.getElementById("not-fitting-summary").textContent =
    `${over.length} candidate${over.length === 1 ? "" : "s"} that do not fit (memory per chip over the chip's)`;
  PlannerAnswer.table(document.getElementById("not-fitting-table"), over, r.frameworks.length);
  PlannerAnswer.pareto(document.getElementById("pareto"), fitting);
  document.getElementById("chip-memory-source").textContent =
    `Chip memory: ${GS.bytes(answer.chip_memory_bytes)} — ${answer.chip_memory_source}.`;
  document.getElementById("caveats").replaceChildren(...answer.caveats.map((c) => GS.el("li", {}, c)));
  // How far a plan's XLA:CPU estimate was from a measured peak, wherever both exist.
  document.getElementById("plan-checks-title").hidden = !answer.plan_checks.length;
  document.getElementById("plan-checks").replaceChildren(...answer.plan_checks.map((c) => GS.el("li", {},
    `${c.point}: plan ${GS.bytes(c.plan_estimate_bytes)} (trial ${c.plan_trial_id}) vs measured ` +
    `${GS.bytes(c.measured_peak_bytes)} (${c.measured_source}, trial ${c.measured_trial_id}): ` +
    `${c.ratio.toFixed(2)}×`)));
};
