// The sweep page's plotly figures, built from succeeded trials only.
//
// Repeats of a grid point are drawn as one point: the median over the repeats of their
// tokens/s/chip, with an error bar from the slowest to the fastest measured step of any repeat
// (so run-to-run spread widens the bar instead of scattering points). One-chip baselines
// (mode "none") are a series of their own in the chips = 1 panel, and the first point of every
// CP mode's line in the scaling chart.
"use strict";

const Plots = {};
Plots.CONFIG = { responsive: true, displaylogo: false };
Plots.FONT = "12px 'Open Sans', verdana, arial, sans-serif";  // plotly's default legend font

// Trials with a speed figure `metric` to draw: never a run through the kernels' interpreters
// (GS.interpreted: a correctness check, whose step time is the interpreter's).
Plots.ok = (trials, metric) => trials.filter((t) => t.status === "succeeded" && t[metric] !== null &&
                                                    !GS.interpreted(t));
// A speed plot's empty note when every succeeded trial ran interpreted (else `otherwise`).
Plots.speedEmpty = function (trials, otherwise) {
  const done = trials.filter((t) => t.status === "succeeded");
  return done.length && done.every(GS.interpreted) ? "only runs through the kernels' interpreters " +
    "succeeded: a correctness check, not a speed" : otherwise;
};

Plots.median = function (values) {
  const s = [...values].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

// Sequence lengths as people say them: 65536 → "64k", 1048576 → "1M".
Plots.tokens = function (n) {
  if (n >= 1048576 && n % 1048576 === 0) return n / 1048576 + "M";
  if (n >= 1024 && n % 1024 === 0) return n / 1024 + "k";
  return String(n);
};

// One panel per value (chip count or seq_len) in a grid of up to 4 columns; returns the
// layout's axes and panel titles. x is log-scaled with the given ticks.
Plots.panels = function (values, panelTitle, x, yTitle, yType) {
  const cols = Math.min(values.length, 4) || 1, rows = Math.ceil(values.length / cols);
  const layout = { annotations: [], height: 300 * rows + 80 };
  const xRange = [Math.log10(Math.min(...x.ticks) / 1.4), Math.log10(Math.max(...x.ticks) * 1.4)];
  values.forEach((value, i) => {
    const r = Math.floor(i / cols), c = i % cols, n = i ? i + 1 : "";
    layout["xaxis" + n] = { domain: [c / cols + 0.03, (c + 1) / cols - 0.03], anchor: "y" + n,
                            type: "log", title: { text: x.title }, tickvals: x.ticks,
                            ticktext: x.ticks.map(x.label || String), range: xRange };
    layout["yaxis" + n] = { domain: [1 - (r + 1) / rows + 0.08, 1 - r / rows - 0.04], anchor: "x" + n,
                            type: yType || "linear", title: { text: c === 0 ? yTitle : "" },
                            tickformat: yType === "log" ? undefined : ",", hoverformat: ",.3~r",
                            rangemode: "tozero" };  // from zero: one point gets a sane scale
    layout.annotations.push({ text: panelTitle(value), showarrow: false, xref: "x" + n + " domain",
                              yref: "y" + n + " domain", x: 0.5, y: 1.08 });
  });
  return layout;
};

Plots.axisSuffix = (i) => (i ? String(i + 1) : "");

// Panels of `layout` that no data trace is drawn in: an empty trace keeps each one drawn in
// its place (plotly leaves out subplots without traces, piling their titles into the first)
// and a note says why it is empty, on blank axes.
Plots.markEmptyPanels = function (layout, panels, traces, emptyText, isData) {
  for (let i = 0; i < panels; i += 1) {
    const { xaxis, yaxis } = Plots.axes(i);
    const here = traces.filter((t) => t.xaxis === xaxis && t.yaxis === yaxis);
    if (here.some(isData)) continue;
    if (!here.length) {
      traces.push({ type: "scatter", x: [], y: [], xaxis, yaxis, showlegend: false, hoverinfo: "skip" });
      Object.assign(layout["yaxis" + Plots.axisSuffix(i)],
                    { showticklabels: false, showgrid: false, zeroline: false });
    }
    layout.annotations.push({ text: emptyText, showarrow: false, x: 0.5, y: 0.5,
                              xref: xaxis + " domain", yref: yaxis + " domain",
                              font: { color: "#5f6b7a" } });
  }
};

Plots.axes = (i) => ({ xaxis: "x" + Plots.axisSuffix(i), yaxis: "y" + Plots.axisSuffix(i) });

// tokens/s/chip of a trial at its median, fastest and slowest measured step.
Plots.throughputRange = function (t) {
  const y = t.tokens_per_s_per_chip, at = (s) => (s ? (y * t.step_time_s) / s : y);
  return { y, hi: at(t.step_time_min_s), lo: at(t.step_time_max_s) };
};

// One point per (chips, seq_len) of `rows`: repeats merged (median; bar over every step).
Plots.throughputPoints = function (rows) {
  return [...GS.groupBy(rows, (t) => `${t.chips}|${t.seq_len}`).values()].map((ts) => {
    const r = ts.map(Plots.throughputRange);
    return { chips: ts[0].chips, seq_len: ts[0].seq_len, y: Plots.median(r.map((p) => p.y)),
             hi: Math.max(...r.map((p) => p.hi)), lo: Math.min(...r.map((p) => p.lo)),
             text: `${ts.length} run${ts.length === 1 ? "" : "s"} · ` +
                   `${ts.map((t) => t.measured_steps || "?").join("+")} measured steps` };
  });
};

Plots.throughputTrace = function (points, x, name, first, extra) {
  points.sort((a, b) => a[x] - b[x]);
  return Object.assign({
    x: points.map((p) => p[x]), y: points.map((p) => p.y), name, legendgroup: name,
    showlegend: first, type: "scatter", mode: "lines+markers", hovertext: points.map((p) => p.text),
    error_y: { type: "data", symmetric: false, visible: true, thickness: 1.2, width: 4,
               array: points.map((p) => p.hi - p.y), arrayminus: points.map((p) => p.y - p.lo) },
  }, extra);
};

// "No trial has succeeded yet" while trials may still come, else plainly that none did.
Plots.emptyText = (sweep, what = "trial") => (GS.FINAL_SWEEP.has(sweep.status) ?
  `no ${what} succeeded` : `no ${what} has succeeded yet`);

Plots.throughput = function (sweep, trials) {
  const chipsList = sweep.spec.chips, seqs = sweep.spec.seq_lens, seen = new Set(), traces = [];
  const layout = Plots.panels(chipsList, (c) => `chips = ${c}`,
                              { title: "seq_len", ticks: seqs, label: Plots.tokens }, "tokens/s/chip");
  layout.title = { text: "tokens/s/chip vs seq_len, per mode",
                   subtitle: { text: "one panel per chip count; bars: fastest to slowest measured step<br>" + GS.STYLE_KEY } };
  const rows = Plots.ok(trials, "tokens_per_s_per_chip");
  for (const [key, group] of GS.groupBy(rows, (t) => `${GS.series(t)}|${t.chips}`)) {
    const [name, chips] = key.split("|"), t = group[0];
    traces.push(Plots.throughputTrace(Plots.throughputPoints(group), "seq_len", name, !seen.has(name), {
      ...Plots.axes(chipsList.indexOf(Number(chips))), ...GS.lineOf(t) }));
    seen.add(name);
  }
  return { traces, layout, panels: chipsList.length, empty: Plots.speedEmpty(trials) };
};

// tokens/s/chip vs chips, one panel per seq_len: every CP mode's line starts at the one-chip
// baseline its trials name (baseline_trial_id), whatever the mode.
Plots.scaling = function (sweep, trials) {
  const seqs = sweep.spec.seq_lens, chipsList = sweep.spec.chips, seen = new Set(), traces = [];
  const layout = Plots.panels(seqs, (s) => `seq_len = ${Plots.tokens(s)}`,
                              { title: "chips", ticks: chipsList }, "tokens/s/chip");
  layout.title = { text: "scaling: tokens/s/chip vs chips from the one-chip baseline",
                   subtitle: { text: "one panel per seq_len; flat = perfect scaling<br>" + GS.STYLE_KEY } };
  const rows = Plots.ok(trials, "tokens_per_s_per_chip");
  const byId = new Map(rows.map((t) => [t.id, t]));
  const multi = rows.filter((t) => t.chips > 1);
  for (const [key, group] of GS.groupBy(multi, (t) => `${GS.series(t)}|${t.seq_len}`)) {
    const [name, seq] = key.split("|"), t = group[0];
    const baselines = [...new Set(group.map((g) => byId.get(g.baseline_trial_id)).filter(Boolean))];
    traces.push(Plots.throughputTrace(Plots.throughputPoints([...baselines, ...group]), "chips", name,
      !seen.has(name), { ...Plots.axes(seqs.indexOf(Number(seq))), ...GS.lineOf(t) }));
    seen.add(name);
  }
  const empty = chipsList.some((c) => c > 1) ? Plots.emptyText(sweep, "trial on more than one chip")
    : "this sweep runs on one chip only: nothing to scale";
  return { traces, layout, panels: seqs.length, empty: Plots.speedEmpty(trials, empty) };
};

// What a memory figure is. Measured peaks (device allocator, process RSS) and XLA's estimate
// and gdn_core's prediction are different quantities: each is its own series, never mixed.
Plots.measuredLabel = function (source) {
  const s = String(source || "");
  if (s.startsWith("process_rss")) return "process RSS (measured)";
  if (s.startsWith("cuda_") || s.includes("peak_bytes_in_use")) return "device peak (measured)";
  return `measured: ${s || "unknown"}`;
};

Plots.MEMORY_QUANTITIES = [
  { field: "peak_memory_bytes_per_chip", label: (t) => Plots.measuredLabel(t.memory_source),
    dash: "solid" },
  { field: "estimated_memory_bytes_per_chip", label: () => "XLA estimate", dash: "dot" },
  { field: "predicted_memory_bytes_per_chip", label: () => "predicted", dash: "dashdot" },
];

// Bytes as hover text: "1.5 GiB at seq_len 4096", the series' name beside it.
Plots.bytesHover = (trace) => Object.assign(trace, {
  customdata: trace.y.map(GS.bytes), hovertemplate: "%{customdata} at seq_len %{x}<extra>%{fullData.name}</extra>" });

// Memory traces per chips panel: one per (series, quantity); `meta.quantity` names it.
Plots.memoryTraces = function (sweep, trials) {
  const chipsList = sweep.spec.chips, traces = [], seen = new Set();
  const done = trials.filter((t) => t.status === "succeeded");
  for (const q of Plots.MEMORY_QUANTITIES) {
    const rows = done.filter((t) => t[q.field] !== null && t[q.field] !== undefined);
    const groups = GS.groupBy(rows, (t) => `${GS.series(t)} · ${q.label(t)}|${t.chips}`);
    for (const [key, group] of groups) {
      const [name, chips] = key.split("|"), t = group[0];
      const points = [...GS.groupBy(group, (g) => g.seq_len).values()].map((gs) => ({
        x: gs[0].seq_len, y: Math.max(...gs.map((g) => g[q.field])) }));  // repeats: the highest
      points.sort((a, b) => a.x - b.x);
      traces.push(Plots.bytesHover({
        x: points.map((p) => p.x), y: points.map((p) => p.y), name, legendgroup: name,
        showlegend: !seen.has(name), type: "scatter", mode: "lines+markers",
        meta: { quantity: q.field, label: q.label(t) },
        ...Plots.axes(chipsList.indexOf(Number(chips))),
        line: { color: GS.seriesColor(t), dash: q.dash, width: GS.seriesStyle(t).width },
        marker: { color: GS.seriesColor(t), symbol: GS.seriesStyle(t).symbol, size: 7 } }));
      seen.add(name);
    }
  }
  return traces;
};

// Ticks of a log bytes axis over [lo, hi], labelled in binary units ("256 MiB", "4 GiB"):
// powers of two when the range spans several, else round steps of the largest unit.
Plots.byteTicks = function (lo, hi) {
  const first = Math.floor(Math.log2(lo)), last = Math.ceil(Math.log2(hi));
  let values = [];
  if (last - first >= 3) {
    const step = Math.ceil((last - first) / 8);
    for (let k = first; k <= last; k += step) values.push(2 ** k);
  } else {
    const unit = 1024 ** Math.max(0, Math.floor(Math.log(hi) / Math.log(1024)));
    const raw = (hi - lo) / unit / 4, magnitude = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * magnitude).find((m) => m >= raw) * unit;
    for (let v = Math.max(step, Math.floor(lo / step) * step); v <= hi + step; v += step) values.push(v);
  }
  return { tickvals: values, ticktext: values.map(GS.bytes) };
};

Plots.memory = function (sweep, trials) {
  const chipsList = sweep.spec.chips, seqs = sweep.spec.seq_lens;
  const layout = Plots.panels(chipsList, (c) => `chips = ${c}`,
                              { title: "seq_len", ticks: seqs, label: Plots.tokens },
                              "memory per chip", "log");
  layout.title = { text: "memory per chip vs seq_len", subtitle: { text:
    "measured peak (solid), XLA estimate (dotted), prediction (dash-dot); colour: CP mode, darker " +
    "for fused kernels; marker: framework and decoder" +
    (sweep.chip_memory_bytes ? "; grey dots: " + sweep.chip_memory_label : "") } };
  const traces = Plots.memoryTraces(sweep, trials);
  if (sweep.chip_memory_bytes) {
    const span = [seqs[0] / 1.5, seqs[seqs.length - 1] * 1.5];  // a bit beyond them (log x)
    chipsList.forEach((_, i) => {
      traces.push(Plots.bytesHover({
        x: span, y: [sweep.chip_memory_bytes, sweep.chip_memory_bytes], name: "chip memory",
        legendgroup: "chip memory", showlegend: i === 0, type: "scatter", mode: "lines",
        meta: { context: true }, ...Plots.axes(i), line: { color: "#999", dash: "dot" } }));
    });
  }
  const ooms = trials.filter((t) => t.status === "oom");
  chipsList.forEach((chips, i) => {
    const here = ooms.filter((t) => t.chips === chips);
    if (!here.length) return;
    traces.push({ x: here.map((t) => t.seq_len), type: "scatter", mode: "markers", name: "oom",
                  y: here.map((t) => t.peak_memory_bytes_per_chip || sweep.chip_memory_bytes),
                  hovertext: here.map((t) => `${GS.series(t)}: out of memory`),
                  legendgroup: "oom", showlegend: !traces.some((t) => t.name === "oom"),
                  ...Plots.axes(i), marker: { symbol: "x", size: 10, color: "#000" } });
  });
  const ys = traces.flatMap((t) => t.y).filter((y) => y > 0);
  if (ys.length) {  // one scale and one unit style on every panel
    const lo = Math.min(...ys), hi = Math.max(...ys);
    const ticks = Plots.byteTicks(lo, hi), range = [Math.log10(lo / 1.5), Math.log10(hi * 1.5)];
    chipsList.forEach((_, i) => Object.assign(layout["yaxis" + Plots.axisSuffix(i)], ticks, { range }));
  }
  return { traces, layout, panels: chipsList.length, isData: (t) => !(t.meta && t.meta.context) };
};

Plots.mfu = function (sweep, trials) {
  const rows = Plots.ok(trials, "mfu");
  const names = [...new Set(rows.map(GS.series))].sort();
  const chipsList = sweep.spec.chips;
  const traces = names.map((name) => {
    const best = chipsList.map((chips) => {
      const pts = rows.filter((t) => GS.series(t) === name && t.chips === chips);
      return pts.length ? pts.reduce((a, b) => (b.mfu > a.mfu ? b : a)) : null;
    });
    const sample = rows.find((t) => GS.series(t) === name);
    return { type: "bar", name, x: chipsList.map((c) => `${c} chip${c === 1 ? "" : "s"}`),
             y: best.map((t) => (t ? t.mfu : null)),
             customdata: best.map((t) => (t ? `${GS.pct(t.mfu)} at seq_len ${t.seq_len}` : "")),
             hovertemplate: "%{customdata}<extra>%{fullData.name}</extra>", textposition: "none",
             marker: { color: GS.seriesColor(sample), pattern: { shape: GS.seriesStyle(sample).pattern } } };
  });
  const layout = { title: { text: "MFU by mode × chips", subtitle: { text: "best over seq_len; colour: CP mode, " +
                   "darker for fused kernels; hatching: torch /, jax hybrid ·, torch hybrid ×" } },
                   barmode: "group", height: 380, yaxis: { title: { text: "MFU" }, tickformat: ".3~%",
                   rangemode: "tozero" }, xaxis: { type: "category" } };
  return { traces, layout, empty: Plots.speedEmpty(trials) };
};

// Room for every legend entry below the panels (a legend beside them clips long names, one
// taller than its box scrolls): entries as wide as the longest name, and as many rows as that
// takes at this width, at the row height this figure's legend last had (30 px until drawn).
Plots.fitLegend = function (layout, traces, div) {
  const names = traces.filter((t) => t.showlegend !== false && t.name).map((t) => t.name);
  const ctx = (Plots.canvas = Plots.canvas || document.createElement("canvas")).getContext("2d");
  ctx.font = Plots.FONT;
  const text = Math.ceil(Math.max(0, ...names.map((n) => ctx.measureText(n).width))) + 8;
  const entry = text + 40, usable = Math.max(entry, div.clientWidth - 100);  // 40: symbol, gaps
  const rows = Math.ceil(names.length / Math.max(1, Math.floor(usable / entry)));
  const room = rows * Number(div.dataset.legendRow || 30) + 12;
  div.dataset.panelsHeight = layout.height || 380;
  layout.height = Number(div.dataset.panelsHeight) + room;
  layout.margin = { l: 70, r: 30, t: 110, b: Plots.X_AXIS_ROOM + room };  // t: title, two subtitle lines
  layout.legend = { orientation: "h", x: 0, xanchor: "left", y: 0, yanchor: "bottom",
                    yref: "container", entrywidth: text, entrywidthmode: "pixels", maxheight: room };
};
Plots.X_AXIS_ROOM = 70;  // x tick labels and axis title, between the panels and the legend

// Once plotly has laid the legend out: make its room exactly as tall as its rows (the
// estimate can be off, and a resize changes how many rows there are).
Plots.legendRoom = function (div) {
  const box = div.querySelector("g.legend .scrollbox"), layout = div.layout;
  if (!box || !layout || !layout.legend || layout.legend.yref !== "container") return;
  const rows = new Set([...box.querySelectorAll("g.traces")].map((g) =>
    (/translate\(\s*[-\d.e]+[ ,]\s*([-\d.e]+)/.exec(g.getAttribute("transform") || "") || [])[1])).size;
  const need = Math.ceil(box.getBBox().height) + 12;
  if (rows) div.dataset.legendRow = (need - 12) / rows;
  if (Math.abs(need - layout.legend.maxheight) <= 2) return;
  Plotly.relayout(div, { height: Number(div.dataset.panelsHeight) + need,
                         "margin.b": Plots.X_AXIS_ROOM + need, "legend.maxheight": need });
};

// A figure, or a note saying why there is none: without data plotly draws bare, made-up axes.
Plots.show = function (div, figure, emptyText) {
  const isData = figure.isData || (() => true);
  emptyText = figure.empty || emptyText;
  if (!figure.traces.some(isData)) {
    Plotly.purge(div);
    div.classList.add("no-data");
    div.replaceChildren(GS.el("p", {}, GS.el("strong", {}, figure.layout.title.text), ": " + emptyText));
    return Promise.resolve();
  }
  if (div.classList.contains("no-data")) {
    div.classList.remove("no-data");
    div.replaceChildren();
  }
  if (figure.panels) Plots.markEmptyPanels(figure.layout, figure.panels, figure.traces, emptyText, isData);
  Plots.fitLegend(figure.layout, figure.traces, div);
  return Plotly.react(div, figure.traces, figure.layout, Plots.CONFIG).then(() => {
    if (!div.dataset.legendWatched) {  // a resize lays the legend out anew
      div.dataset.legendWatched = "1";
      div.on("plotly_afterplot", () => Plots.legendRoom(div));
    }
    Plots.legendRoom(div);
  });
};

Plots.FIGURES = { "plot-throughput": Plots.throughput, "plot-scaling": Plots.scaling,
                  "plot-memory": Plots.memory, "plot-mfu": Plots.mfu };

Plots.drawAll = function (sweep, trials) {
  return Promise.all(Object.entries(Plots.FIGURES).map(([id, figure]) =>
    Plots.show(document.getElementById(id), figure(sweep, trials), Plots.emptyText(sweep))));
};
