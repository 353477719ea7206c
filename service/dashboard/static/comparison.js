// What the scaling view (sweep page) and the compare page share: every succeeded result of a
// sweep, repeats merged into one point, series names, numbers written for people, and the
// empty state. Needs common.js (GS.api, GS.el).
"use strict";

const Cmp = {};
Cmp.PLOT_CONFIG = { responsive: true, displaylogo: false };
Cmp.PAGE_ROWS = 5000;
Cmp.MAX_ROWS = 50000;  // per sweep: beyond this a browser tab gets slow; the page says so
Cmp.NO_RESULTS = "no succeeded trial in these sweeps yet";
// What a view says of the results it left out as interpreted ("" for none).
Cmp.interpretedNote = (n) => (n ? `${Cmp.num(n)} interpreted result${n === 1 ? "" : "s"} not drawn ` +
  "(run through the kernels' interpreters: a correctness check, not a speed)" : "");

// Every succeeded result of one sweep with a measured throughput (plan trials have none) and
// not run through the kernels' interpreters (GS.interpreted: no speed), paging through
// GET /api/results: { rows, count, truncated, interpreted: how many were left out as such }.
Cmp.sweepResults = async function (sweepId) {
  const rows = [];
  let count = 0;
  do {
    const page = await GS.api(`/api/results?sweep_id=${sweepId}&sort=id&limit=${Cmp.PAGE_ROWS}` +
                              `&offset=${rows.length}`);
    rows.push(...page.data);
    count = page.count;
    if (!page.data.length) break;
  } while (rows.length < count && rows.length < Cmp.MAX_ROWS);
  const timed = rows.filter((t) => t.tokens_per_s_per_chip !== null && t.tokens_per_s_per_chip !== undefined);
  return { rows: timed.filter((t) => !GS.interpreted(t)), count, truncated: rows.length < count,
           interpreted: timed.filter(GS.interpreted).length };
};

// What has to agree for two trials to be the same work on one chip (any CP mode, attention CP
// or layout): the model, batch and step settings; fused kernels and packed documents are
// other work (a fused trial scales from the fused one chip).
Cmp.workKey = (t) => [t.framework, t.preset, t.num_layers, t.vocab_size, t.layers || "gdn_only",
                      t.batch_size, t.dtype, t.param_sharding, t.remat, t.kernels || "reference",
                      t.documents || "single"].join("|");
// A grid point: the same work, mode, attention CP, layout, chips (and their data-parallel
// replicas) and seq_len; its repeats are one point.
Cmp.pointKey = (t) => [Cmp.workKey(t), t.mode, t.attn_cp || "", t.layout || "contiguous", t.chips,
                       t.dp || 1, t.seq_len].join("|");

Cmp.median = function (values) {
  const s = values.filter((v) => v !== null && v !== undefined).sort((a, b) => a - b);
  if (!s.length) return null;
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

// One point per grid point of `rows`: repeats merged at the median of each figure.
Cmp.points = function (rows) {
  return [...GS.groupBy(rows, Cmp.pointKey).entries()].map(([key, ts]) => {
    const t = ts[0], med = (field) => Cmp.median(ts.map((r) => r[field]));
    const tokensPerSPerChip = med("tokens_per_s_per_chip"), flops = med("hardware_flops_per_step");
    return {
      key, work: Cmp.workKey(t), series: GS.series(t), framework: t.framework, mode: t.mode,
      chips: t.chips, cpChips: t.chips / (t.dp || 1), seq_len: t.seq_len, sample: t, runs: ts.length, trialIds: ts.map((r) => r.id),
      tokensPerSPerChip, totalTokensPerS: tokensPerSPerChip * t.chips,
      scalingEfficiency: med("scaling_efficiency"), mfu: med("mfu"),
      hardwareFlopsPerChip: flops === null ? null : flops / t.chips,
      cpCommBytesPerChip: med("cp_comm_bytes_per_step_per_chip"),
      gradSyncBytesPerChip: med("grad_sync_bytes_per_step_per_chip"),
    };
  });
};

Cmp.byNumber = (a, b) => a - b;
Cmp.distinct = (values) => [...new Set(values)].sort(Cmp.byNumber);

// ---------------------------------------------------------------- numbers written for people

Cmp.missing = (v) => v === null || v === undefined || Number.isNaN(v);

// 12345.6 → "12,346"; 12.34 → "12.3"; 0.01234 → "0.0123" (never exponent notation).
Cmp.num = (v) => (Cmp.missing(v) ? "—" : new Intl.NumberFormat("en-US", Math.abs(v) >= 100
  ? { maximumFractionDigits: 0 } : { maximumSignificantDigits: 3 }).format(v));
Cmp.pct = (v) => (Cmp.missing(v) ? "—" : new Intl.NumberFormat("en-US", { style: "percent",
  maximumFractionDigits: 1 }).format(v));
Cmp.ratio = (v) => (Cmp.missing(v) ? "—" : v.toFixed(2) + "×");

Cmp.BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
// The binary unit a set of byte counts reads best in: { unit, size }.
Cmp.byteUnit = function (maxBytes) {
  let i = 0;
  while (i < Cmp.BYTE_UNITS.length - 1 && maxBytes >= 1024 ** (i + 1)) i += 1;
  return { unit: Cmp.BYTE_UNITS[i], size: 1024 ** i };
};
Cmp.bytes = function (v) {
  if (Cmp.missing(v)) return "—";
  const { unit, size } = Cmp.byteUnit(Math.abs(v));
  return (size === 1 ? String(v) : Cmp.num(v / size)) + " " + unit;
};
Cmp.flops = function (v) {
  if (Cmp.missing(v)) return "—";
  const prefixes = ["", "k", "M", "G", "T", "P", "E"];
  let i = 0;
  while (i < prefixes.length - 1 && Math.abs(v) >= 1000 ** (i + 1)) i += 1;
  return Cmp.num(v / 1000 ** i) + " " + prefixes[i] + "FLOP";
};
// Sequence lengths as people say them: 65536 → "64k", 1048576 → "1M".
Cmp.tokens = function (n) {
  if (n >= 1048576 && n % 1048576 === 0) return n / 1048576 + "M";
  if (n >= 1024 && n % 1024 === 0) return n / 1024 + "k";
  return Cmp.num(n);
};

// Log-axis ticks at powers of `base` spanning `values` (at most ~7; on a short base-10 span,
// also at 2× and 5×), labelled by `label`.
Cmp.logTicks = function (values, base, label) {
  const v = values.filter((x) => x > 0), log = (x) => Math.log(x) / Math.log(base);
  if (!v.length) return {};
  const lo = Math.floor(log(Math.min(...v)) + 1e-9), hi = Math.ceil(log(Math.max(...v)) - 1e-9);
  const step = Math.max(1, Math.ceil((hi - lo) / 6)), steps = base === 10 && hi - lo <= 2 ? [1, 2, 5] : [1];
  const tickvals = [];
  for (let e = lo; e <= Math.max(hi, lo + 1); e += step) tickvals.push(...steps.map((m) => m * base ** e));
  return { tickvals, ticktext: tickvals.map(label) };
};
Cmp.byteTicks = (values) => Cmp.logTicks(values, 2, Cmp.bytes);
Cmp.flopTicks = (values) => Cmp.logTicks(values, 10, Cmp.flops);

// Axis settings shared by every plot: thousands separators, no exponents.
Cmp.NUMBER_AXIS = { tickformat: ",~r", separatethousands: true };
Cmp.chipsAxis = (chips) => ({ title: { text: "chips" }, type: "log", tickvals: chips,
                              ticktext: chips.map(String) });

// A legend below the plot, every entry whole: entries as wide as the longest name, as many
// per row as fit `div`'s width, and the figure `height` (its plot area's) grown by their rows;
// Cmp.react then makes the room exactly as tall as the legend plotly drew.
Cmp.FONT = "12px 'Open Sans', verdana, arial, sans-serif";  // plotly's default legend font
Cmp.LEGEND_ROW = 19;  // px per legend row at that font (an estimate: Cmp.react measures it)
Cmp.legendBelow = function (div, traces, height) {
  const names = traces.filter((t) => t.showlegend !== false && t.name).map((t) => t.name);
  const ctx = (Cmp.canvas = Cmp.canvas || document.createElement("canvas")).getContext("2d");
  ctx.font = Cmp.FONT;
  const text = Math.ceil(Math.max(0, ...names.map((n) => ctx.measureText(n).width))) + 8;
  const perRow = Math.max(1, Math.floor((div.clientWidth || 600) / (text + 40)));  // 40: symbol, gaps
  const room = Math.ceil(names.length / perRow) * Cmp.LEGEND_ROW + 12;
  div.dataset.plotHeight = height;
  return { height: height + room, margin: { t: 50, r: 20, b: Cmp.X_AXIS_ROOM + room },
           legend: { orientation: "h", x: 0, xanchor: "left", y: 0, yanchor: "bottom", yref: "container",
                     entrywidth: text, entrywidthmode: "pixels", maxheight: room } };
};
Cmp.X_AXIS_ROOM = 60;  // x tick labels and axis title, between the plot and the legend

// Plotly.react, then a legend below the plot (Cmp.legendBelow) given exactly the room it took.
Cmp.react = function (div, traces, layout) {
  return Plotly.react(div, traces, layout, Cmp.PLOT_CONFIG).then(() => {
    const box = div.querySelector("g.legend .scrollbox");
    if (!box || !layout.legend || layout.legend.yref !== "container") return undefined;
    const need = Math.ceil(box.getBBox().height) + 12;
    if (Math.abs(need - layout.legend.maxheight) <= 2) return undefined;
    return Plotly.relayout(div, { height: Number(div.dataset.plotHeight) + need,
                                  "margin.b": Cmp.X_AXIS_ROOM + need, "legend.maxheight": need });
  });
};

// The empty state of a view: a sentence instead of a plot (never bare axes).
Cmp.showEmpty = function (container, message) {
  container.querySelectorAll(".js-plotly-plot").forEach((div) => Plotly.purge(div));
  container.replaceChildren(GS.el("p", { class: "empty" }, message));
};
