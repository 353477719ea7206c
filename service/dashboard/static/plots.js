// The sweep page's plotly figures, built from succeeded trials only.
"use strict";

const Plots = {};
Plots.MODE_COLORS = { ulysses: "#1f77b4", p2p: "#d62728", all_gather: "#2ca02c", log_scan: "#9467bd" };
Plots.DASH = { jax: "solid", torch: "dash" };
Plots.CONFIG = { responsive: true, displaylogo: false };

// A series: framework and mode, plus each step setting that differs from the default (so
// points of a sweep over dtypes, param_shardings or remats never share a line).
Plots.series = function (t) {
  const settings = [t.dtype === "float32" ? "" : t.dtype,
                    t.param_sharding === "replicated" ? "" : t.param_sharding,
                    t.remat === "none" ? "" : `remat=${t.remat}`].filter(Boolean);
  return [t.framework, t.mode, ...settings].join(" ");
};

Plots.ok = (trials, metric) => trials.filter((t) => t.status === "succeeded" && t[metric] !== null);

// Sequence lengths as people say them: 65536 → "64k", 1048576 → "1M".
Plots.tokens = function (n) {
  if (n >= 1048576 && n % 1048576 === 0) return n / 1048576 + "M";
  if (n >= 1024 && n % 1024 === 0) return n / 1024 + "k";
  return String(n);
};

// One panel per chip count in a grid of up to 4 columns; returns layout axes and annotations.
Plots.panels = function (chipsList, yTitle, yType, seqLens) {
  const cols = Math.min(chipsList.length, 4), rows = Math.ceil(chipsList.length / cols);
  const layout = { annotations: [], height: 300 * rows + 80 };
  chipsList.forEach((chips, i) => {
    const r = Math.floor(i / cols), c = i % cols, n = i ? i + 1 : "";
    layout["xaxis" + n] = { domain: [c / cols + 0.03, (c + 1) / cols - 0.03], anchor: "y" + n,
                            type: "log", title: { text: "seq_len" }, tickvals: seqLens,
                            ticktext: seqLens.map(Plots.tokens) };
    layout["yaxis" + n] = { domain: [1 - (r + 1) / rows + 0.08, 1 - r / rows - 0.04], anchor: "x" + n,
                            type: yType || "linear", title: { text: c === 0 ? yTitle : "" } };
    layout.annotations.push({ text: `chips = ${chips}`, showarrow: false, xref: "x" + n + " domain",
                              yref: "y" + n + " domain", x: 0.5, y: 1.08 });
  });
  return layout;
};

Plots.lines = function (trials, metric, chipsList) {
  const traces = [], seen = new Set();
  const groups = new Map();
  for (const t of trials) {
    const key = `${Plots.series(t)}|${t.chips}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(t);
  }
  for (const [key, rows] of groups) {
    const [name, chips] = key.split("|");
    const i = chipsList.indexOf(Number(chips)), n = i ? i + 1 : "";
    rows.sort((a, b) => a.seq_len - b.seq_len);
    traces.push({ x: rows.map((t) => t.seq_len), y: rows.map((t) => t[metric]), name,
                  legendgroup: name, showlegend: !seen.has(name), type: "scatter", mode: "lines+markers",
                  xaxis: "x" + n, yaxis: "y" + n,
                  line: { color: Plots.MODE_COLORS[rows[0].mode], dash: Plots.DASH[rows[0].framework] } });
    seen.add(name);
  }
  return traces;
};

Plots.throughput = function (div, sweep, trials) {
  const chipsList = sweep.spec.chips;
  const layout = Plots.panels(chipsList, "tokens/s/chip", "linear", sweep.spec.seq_lens);
  layout.title = { text: "tokens/s/chip vs seq_len, per mode (one panel per chip count)" };
  Plotly.react(div, Plots.lines(Plots.ok(trials, "tokens_per_s_per_chip"), "tokens_per_s_per_chip",
                                chipsList), layout, Plots.CONFIG);
};

Plots.memory = function (div, sweep, trials) {
  const chipsList = sweep.spec.chips;
  const layout = Plots.panels(chipsList, "peak memory per chip", "log", sweep.spec.seq_lens);
  chipsList.forEach((_, i) => Object.assign(layout["yaxis" + (i ? i + 1 : "")],
                                            { tickformat: "~s", ticksuffix: "B" }));
  layout.title = { text: "peak memory per chip vs seq_len" +
                   (sweep.chip_memory_bytes ? " (dotted: " + sweep.chip_memory_label + ")" : "") };
  const traces = Plots.lines(Plots.ok(trials, "peak_memory_bytes_per_chip"),
                             "peak_memory_bytes_per_chip", chipsList);
  if (sweep.chip_memory_bytes) {
    const seqs = sweep.spec.seq_lens;  // sorted; the line spans a bit beyond them (log x)
    const span = [seqs[0] / 1.5, seqs[seqs.length - 1] * 1.5];
    chipsList.forEach((_, i) => {
      const n = i ? i + 1 : "";
      traces.push({ x: span, y: [sweep.chip_memory_bytes, sweep.chip_memory_bytes],
                    name: "chip memory", legendgroup: "chip memory", showlegend: i === 0, type: "scatter",
                    mode: "lines", xaxis: "x" + n, yaxis: "y" + n, line: { color: "#444", dash: "dot" } });
    });
  }
  const ooms = trials.filter((t) => t.status === "oom");
  chipsList.forEach((chips, i) => {
    const here = ooms.filter((t) => t.chips === chips), n = i ? i + 1 : "";
    if (!here.length) return;
    traces.push({ x: here.map((t) => t.seq_len), type: "scatter", mode: "markers", name: "oom",
                  y: here.map((t) => t.peak_memory_bytes_per_chip || sweep.chip_memory_bytes),
                  hovertext: here.map((t) => `${Plots.series(t)}: out of memory`),
                  legendgroup: "oom", showlegend: !traces.some((t) => t.name === "oom"),
                  xaxis: "x" + n, yaxis: "y" + n, marker: { symbol: "x", size: 10, color: "#000" } });
  });
  Plotly.react(div, traces, layout, Plots.CONFIG);
};

Plots.mfu = function (div, sweep, trials) {
  const rows = Plots.ok(trials, "mfu");
  const names = [...new Set(rows.map(Plots.series))].sort();
  const chipsList = sweep.spec.chips;
  const traces = names.map((name) => {
    const best = chipsList.map((chips) => {
      const pts = rows.filter((t) => Plots.series(t) === name && t.chips === chips);
      return pts.length ? pts.reduce((a, b) => (b.mfu > a.mfu ? b : a)) : null;
    });
    const mode = name.split(" ")[1], framework = name.split(" ")[0];
    return { type: "bar", name, x: chipsList.map((c) => `${c} chip${c === 1 ? "" : "s"}`),
             y: best.map((t) => (t ? t.mfu : null)),
             hovertext: best.map((t) => (t ? `best at seq_len ${t.seq_len}` : "")),
             hoverinfo: "x+y+text+name", textposition: "none",
             marker: { color: Plots.MODE_COLORS[mode], pattern: { shape: framework === "torch" ? "/" : "" } } };
  });
  Plotly.react(div, traces, {
    title: { text: "MFU by mode × chips (best over seq_len)" }, barmode: "group", height: 380,
    yaxis: { title: { text: "MFU" }, tickformat: ".2%" }, xaxis: { type: "category" },
  }, Plots.CONFIG);
};

Plots.drawAll = function (sweep, trials) {
  Plots.throughput(document.getElementById("plot-throughput"), sweep, trials);
  Plots.memory(document.getElementById("plot-memory"), sweep, trials);
  Plots.mfu(document.getElementById("plot-mfu"), sweep, trials);
};
