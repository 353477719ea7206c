// The sweep page's scaling view: which CP mode scales best. Total tokens/s and scaling
// efficiency against chips, one line per mode, at a fixed global seq_len (strong scaling) or
// a fixed local shard, seq_len ÷ chips (weak scaling); the best mode at each chip count; the
// recorded compute and communication per chip. The sweep page carries only this script and
// a #scaling-view element: the helpers (comparison.js) and styles are loaded from here.
"use strict";

const Scaling = {};
Scaling.REFRESH_MS = 5000;
Scaling.EMPTY = "no succeeded trial in this sweep yet";

// The slices a sweep's points can be read at: each global seq_len, and each local shard
// (seq_len ÷ a replica's CP chips: chips ÷ dp) that two or more chip counts reach.
Scaling.slices = function (points) {
  const global = Cmp.distinct(points.map((p) => p.seq_len)).map((tokens) => ({
    value: `global:${tokens}`, kind: "global", tokens, label: `seq_len ${Cmp.tokens(tokens)}` }));
  const byLocal = GS.groupBy(points.filter((p) => p.seq_len % p.cpChips === 0),
                              (p) => p.seq_len / p.cpChips);
  const local = [...byLocal].filter(([, ps]) => new Set(ps.map((p) => p.chips)).size > 1)
    .map(([tokens]) => tokens).sort(Cmp.byNumber).map((tokens) => ({
      value: `local:${tokens}`, kind: "local", tokens,
      label: `${Cmp.tokens(tokens)} tokens per chip` }));
  return { global, local };
};

Scaling.slicePoints = (points, slice) => points.filter((p) => p.seq_len ===
  (slice.kind === "global" ? slice.tokens : slice.tokens * p.cpChips));

// One line per CP-mode series of a slice, by chips, starting at the one-chip run of the same
// work (the shared baseline, mode none, or the mode's own chips = 1 run). Efficiency: the
// API's scaling_efficiency at a global seq_len; at a local shard, tokens/s/chip ÷ the
// one-chip run's at that shard (weak scaling).
Scaling.lines = function (slicePts, slice) {
  // the one-chip baseline: mode none on one chip (not a pure data-parallel mesh, chips = dp)
  const shared = new Map(slicePts.filter((p) => p.mode === "none" && p.chips === 1).map((p) => [p.work, p]));
  const cp = slicePts.filter((p) => p.mode !== "none");
  return [...GS.groupBy(cp, (p) => p.series)].map(([series, ps]) => {
    const base = shared.get(ps[0].work) || ps.find((p) => p.chips === 1) || null;
    const points = (base && !ps.includes(base) ? [base, ...ps] : ps)
      .sort((a, b) => a.chips - b.chips);
    const ratio = (p) => (base ? p.tokensPerSPerChip / base.tokensPerSPerChip : null);
    const efficiency = (p) => {
      if (p === base) return 1;
      return slice.kind === "global" && p.scalingEfficiency !== null ? p.scalingEfficiency : ratio(p);
    };
    return { series, mode: ps[0].mode, framework: ps[0].framework, sample: ps[0].sample, points,
             chips: points.map((p) => p.chips), total: points.map((p) => p.totalTokensPerS),
             efficiency: points.map(efficiency) };
  }).sort((a, b) => a.series.localeCompare(b.series));
};

// Per chip count of a slice: the point with the highest total tokens/s, and the runner-up.
Scaling.best = (slicePts) => [...GS.groupBy(slicePts, (p) => p.chips)]
  .sort((a, b) => a[0] - b[0]).map(([chips, ps]) => {
    const ranked = [...ps].sort((a, b) => b.totalTokensPerS - a.totalTokensPerS);
    return { chips, best: ranked[0], next: ranked[1] || null };
  });


Scaling.drawTotal = function (div, lines, slice, chips) {
  const traces = lines.map((l) => ({
    type: "scatter", mode: "lines+markers", name: l.series, x: l.chips, y: l.total,
    meta: { mode: l.mode }, ...GS.lineOf(l.sample),
    hovertemplate: "%{fullData.name}<br>%{x} chips: %{y:,.0f} tokens/s<extra></extra>" }));
  return Cmp.react(div, traces, {
    title: { text: `total tokens/s vs chips at ${slice.label}` }, ...Cmp.legendBelow(div, traces, 320),
    xaxis: Cmp.chipsAxis(chips),
    yaxis: { title: { text: "tokens/s, all chips" }, rangemode: "tozero", ...Cmp.NUMBER_AXIS },
  });
};

Scaling.drawEfficiency = function (div, lines, slice, chips) {
  const traces = lines.map((l) => ({
    type: "scatter", mode: "lines+markers", name: l.series, x: l.chips, y: l.efficiency,
    meta: { mode: l.mode }, ...GS.lineOf(l.sample),
    hovertemplate: "%{fullData.name}<br>%{x} chips: %{y:.1%} of one chip's tokens/s/chip<extra></extra>" }));
  const top = Math.max(1.1, ...lines.flatMap((l) => l.efficiency).filter((e) => e !== null)) * 1.05;
  return Cmp.react(div, traces, {
    title: { text: slice.kind === "global" ? "scaling efficiency (tokens/s/chip ÷ one chip's)"
                                           : `weak scaling: tokens/s/chip ÷ one chip's at ${slice.label}` },
    ...Cmp.legendBelow(div, traces, 320), xaxis: Cmp.chipsAxis(chips),
    yaxis: { title: { text: "efficiency" }, tickformat: ".0%", range: [0, top] },
    shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1,
               line: { color: "#999", dash: "dot", width: 1 } }],
  });
};

Scaling.bestTable = function (table, slicePts) {
  const cell = (text, attrs) => GS.el("td", attrs || { class: "num" }, text);
  const rows = Scaling.best(slicePts).map(({ chips, best, next }) => GS.el("tr", {
    "data-chips": chips, "data-best-mode": best.mode, "data-best-series": best.series,
    "data-best-total": best.totalTokensPerS },
    cell(chips), GS.el("td", { class: "best" }, best.series), cell(Cmp.num(best.totalTokensPerS)),
    cell(Cmp.num(best.tokensPerSPerChip)), cell(Cmp.tokens(best.seq_len)),
    GS.el("td", { class: "muted" }, next ? `${next.series}: ${Cmp.num(next.totalTokensPerS)}, ` +
          `${Cmp.pct(1 - next.totalTokensPerS / best.totalTokensPerS)} less` : "only one")));
  table.replaceChildren(GS.el("thead", {}, GS.el("tr", {}, ...["chips", "best mode",
    "tokens/s (all chips)", "tokens/s/chip", "seq_len", "next best"].map((h) => GS.el("th", {}, h)))),
    GS.el("tbody", {}, ...rows));
};

// Compute and communication per chip per step, as recorded (no time split is recorded, so
// none is drawn): hardware FLOPs ÷ chips on the left; bytes each chip received on the right,
// CP exchanges solid and gradient sync dotted (chips > 1: one chip exchanges nothing), in the
// series' colour and marker. The legend names each series once (clicking it hides it in both
// panels) and keys the communication panel's two dashes.
Scaling.COMM = [["cpCommBytesPerChip", "CP exchanges", "solid"], ["gradSyncBytesPerChip", "gradient sync", "dot"]];

Scaling.drawBreakdown = function (div, lines, chips) {
  const traces = [], flops = [], bytes = [];
  for (const l of lines) {
    const look = GS.lineOf(l.sample), group = { name: l.series, legendgroup: l.series, meta: { mode: l.mode } };
    const f = l.points.filter((p) => p.hardwareFlopsPerChip !== null);
    flops.push(...f.map((p) => p.hardwareFlopsPerChip));
    traces.push({ type: "scatter", mode: "lines+markers", ...group, ...look,
                  x: f.map((p) => p.chips), y: f.map((p) => p.hardwareFlopsPerChip),
                  text: f.map((p) => Cmp.flops(p.hardwareFlopsPerChip)),
                  hovertemplate: "%{fullData.name}<br>%{x} chips: %{text} per chip per step<extra></extra>" });
    for (const [field, what, dash] of Scaling.COMM) {
      const c = l.points.filter((p) => p.chips > 1 && p[field] > 0);
      bytes.push(...c.map((p) => p[field]));
      traces.push({ type: "scatter", mode: "lines+markers", ...group, name: `${l.series} · ${what}`,
                    xaxis: "x2", yaxis: "y2",
                    line: { ...look.line, dash }, marker: look.marker, meta: { ...group.meta, comm: what },
                    x: c.map((p) => p.chips), y: c.map((p) => p[field]),
                    text: c.map((p) => Cmp.bytes(p[field])),
                    hovertemplate: "%{fullData.name}<br>%{x} chips: %{text} received per chip per step<extra></extra>" });
    }
  }
  const named = new Set();
  for (const t of traces) {  // each series once: on its first trace with a point (FLOPs first)
    t.showlegend = t.x.length > 0 && !named.has(t.legendgroup);
    if (t.showlegend) named.add(t.legendgroup);
  }
  if (bytes.length) {
    for (const [, what, dash] of Scaling.COMM) {
      traces.push({ type: "scatter", mode: "lines", name: `communication: ${what}`, legendgroup: "key",
                    x: [null], y: [null], xaxis: "x2", yaxis: "y2", hoverinfo: "skip",
                    meta: { key: what }, line: { color: "#5f6b7a", dash, width: 2 } });
    }
  }
  const note = (x, text) => ({ text, xref: "paper", yref: "paper", x, y: 0.5, showarrow: false,
                               font: { color: "#5f6b7a" } });
  return Cmp.react(div, traces, {
    ...Cmp.legendBelow(div, traces, 320), xaxis: { ...Cmp.chipsAxis(chips), domain: [0, 0.45] },
    yaxis: { title: { text: "hardware FLOPs per chip per step" }, type: "log", ...Cmp.flopTicks(flops) },
    xaxis2: { ...Cmp.chipsAxis(chips.filter((c) => c > 1)), domain: [0.55, 1], anchor: "y2" },
    yaxis2: { title: { text: "bytes received per chip per step" }, type: "log", anchor: "x2",
              ...Cmp.byteTicks(bytes) },
    annotations: [
      { text: "compute: hardware_flops_per_step ÷ chips", xref: "paper", yref: "paper", x: 0.22,
        y: 1.1, showarrow: false },
      { text: "communication: CP exchanges (solid) · gradient sync (dotted)", xref: "paper",
        yref: "paper", x: 0.78, y: 1.1, showarrow: false },
      ...(flops.length ? [] : [note(0.22, "no hardware FLOPs recorded")]),
      ...(bytes.length ? [] : [note(0.78, "no bytes exchanged between chips recorded")]),
    ],
  });
};

Scaling.SOURCES = "Recorded per trial, nothing modelled: compute is hardware_flops_per_step ÷ chips " +
  "(the FLOPs that ran: the model's, the CP mode's extra work and recomputation); communication is " +
  "what each chip received in one step, cp_comm_bytes_per_step_per_chip (the CP mode's exchanges " +
  "and the conv halo) and grad_sync_bytes_per_step_per_chip (gradient all-reduce or " +
  "reduce-scatter, zero1/fsdp weight gathers). No split of step time into compute and " +
  "communication is recorded, so none is shown. Repeats of a point: their median.";

Scaling.skeleton = function (body) {
  body.replaceChildren(
    GS.el("div", { class: "cmp-pair" }, GS.el("div", { id: "scaling-total", class: "cmp-plot" }),
          GS.el("div", { id: "scaling-efficiency", class: "cmp-plot" })),
    GS.el("h3", {}, "Best mode at each chip count ", GS.el("span", { class: "muted" },
          "(highest total tokens/s)")),
    GS.el("table", { id: "scaling-best", class: "cmp-table" }),
    GS.el("h3", {}, "Compute and communication per chip, by mode"),
    GS.el("div", { id: "scaling-breakdown", class: "cmp-plot" }),
    GS.el("p", { class: "muted sources" }, Scaling.SOURCES));
};

// The slice selector's options; keeps the chosen one, else picks the largest global seq_len
// that two chip counts reach.
Scaling.fillSelect = function (select, slices, points) {
  const all = [...slices.global, ...slices.local], chosen = select.value;
  const signature = all.map((s) => s.value).join(",");
  if (select.dataset.signature !== signature) {
    select.replaceChildren(
      GS.el("optgroup", { label: "fixed global seq_len (strong scaling)" },
            ...slices.global.map((s) => GS.el("option", { value: s.value }, s.label))),
      ...(slices.local.length ? [GS.el("optgroup", { label: "fixed local shard: seq_len ÷ chips (weak scaling)" },
            ...slices.local.map((s) => GS.el("option", { value: s.value }, s.label)))] : []));
    select.dataset.signature = signature;
    const spread = slices.global.filter((s) => new Set(Scaling.slicePoints(points, s).map((p) => p.chips)).size > 1);
    const fallback = (spread.length ? spread : slices.global).at(-1);
    select.value = all.some((s) => s.value === chosen) ? chosen : fallback.value;
  }
  return all.find((s) => s.value === select.value);
};

Scaling.render = function (root, results) {
  const body = root.querySelector("#scaling-body"), select = root.querySelector("#scaling-slice");
  const controls = root.querySelector(".cmp-controls");
  const points = Cmp.points(results.rows);
  root.querySelector("#scaling-truncated").textContent = [results.truncated
    ? `first ${Cmp.num(Cmp.MAX_ROWS)} of ${Cmp.num(results.count)} results shown` : "",
    Cmp.interpretedNote(results.interpreted)].filter(Boolean).join("; ");
  if (!points.length) {
    controls.hidden = true;
    Cmp.showEmpty(body, Cmp.interpretedNote(results.interpreted) || Scaling.EMPTY);
    root.dataset.state = "empty";
    return;
  }
  controls.hidden = false;
  if (!body.querySelector("#scaling-total")) Scaling.skeleton(body);
  const slice = Scaling.fillSelect(select, Scaling.slices(points), points);
  const slicePts = Scaling.slicePoints(points, slice), lines = Scaling.lines(slicePts, slice);
  const chips = Cmp.distinct(slicePts.map((p) => p.chips));
  Scaling.drawTotal(body.querySelector("#scaling-total"), lines, slice, chips);
  Scaling.drawEfficiency(body.querySelector("#scaling-efficiency"), lines, slice, chips);
  Scaling.bestTable(body.querySelector("#scaling-best"), slicePts);
  Scaling.drawBreakdown(body.querySelector("#scaling-breakdown"), lines, chips);
  root.dataset.state = "drawn";
  root.dataset.slice = slice.value;
};

Scaling.load = (src) => new Promise((resolve, reject) => document.head.append(
  GS.el("script", { src, onload: resolve, onerror: () => reject(new Error("cannot load " + src)) })));

Scaling.start = async function () {
  const root = document.getElementById("scaling-view");
  if (!root) return;
  document.head.append(GS.el("link", { rel: "stylesheet", href: "/static/comparison.css" }));
  await Scaling.load("/static/comparison.js");
  const sweepId = Number(window.location.pathname.split("/").filter(Boolean).pop());
  const select = GS.el("select", { id: "scaling-slice" });
  root.classList.add("scaling-view");
  root.replaceChildren(
    GS.el("h2", {}, "Scaling ", GS.el("span", { class: "muted" }, "which CP mode scales best"),
          GS.el("a", { class: "cmp-link", href: `/compare?sweep=${sweepId}` }, "compare with other sweeps")),
    GS.el("div", { class: "cmp-controls", hidden: true }, GS.el("label", { for: "scaling-slice" }, "points at"), select,
          GS.el("span", { class: "muted", id: "scaling-truncated" })),
    GS.el("pre", { class: "errors", id: "scaling-error" }),
    GS.el("div", { id: "scaling-body" }));
  let latest = null;
  select.addEventListener("change", () => latest && Scaling.render(root, latest));
  const refresh = async () => {
    let again = true;
    try {
      const [sweep, results] = await Promise.all([GS.api(`/api/sweeps/${sweepId}`),
                                                  Cmp.sweepResults(sweepId)]);
      latest = results;
      root.querySelector("#scaling-error").textContent = "";
      Scaling.render(root, results);
      again = !GS.FINAL_SWEEP.has(sweep.status);
    } catch (err) {
      root.querySelector("#scaling-error").textContent = "cannot load the scaling view: " + err.message;
    }
    if (again) setTimeout(refresh, Scaling.REFRESH_MS);
  };
  refresh();
};

Scaling.start();
