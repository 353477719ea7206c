// The compare page: every result of the chosen sweeps as parallel coordinates, and two or more
// sweeps side by side (their matching points' tokens/s/chip and the ratio; tokens/s/chip vs
// chips per sweep and mode). The chosen sweeps live in the URL: /compare?sweep=3&sweep=5, the
// first being the one the ratios divide by.
"use strict";

const Compare = {};
Compare.SWEEP_PAGES = 5;  // × 200: the newest 1,000 sweeps are offered; older ones by URL
// A sweep's marker on the side-by-side lines (colour and dash are the series': GS.lineOf).
Compare.SWEEP_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "cross", "hexagon"];
Compare.SWEEP_LABEL_CHARS = 28;  // a sweep axis label: "#id name", longer names cut with "…"
Compare.sweeps = new Map();  // id → sweep, every sweep the picker knows
Compare.results = new Map();  // id → { rows, count, truncated }
Compare.FIGURE_FORMAT = ",.3~r";  // parcoords prints its axes' ends in it too: 72,089.6 → 72,100

// ---------------------------------------------------------------- the chosen sweeps (URL)

Compare.fromUrl = function () {
  const raw = new URLSearchParams(window.location.search).getAll("sweep");
  const ids = [], bad = [];
  for (const value of raw) {
    const id = Number(value);
    if (/^[0-9]+$/.test(value) && id > 0) { if (!ids.includes(id)) ids.push(id); } else bad.push(value);
  }
  return { ids, bad };
};

Compare.toUrl = function (ids) {
  const query = new URLSearchParams(ids.map((id) => ["sweep", String(id)])).toString();
  window.history.replaceState(null, "", window.location.pathname + (query ? "?" + query : ""));
};

Compare.chosen = () => Compare.fromUrl().ids.filter((id) => Compare.sweeps.has(id));

// ---------------------------------------------------------------- parallel coordinates

// A categorical axis: values encoded as their index, labelled with tickvals/ticktext.
Compare.categorical = function (label, rows, valueOf, textOf = String, order = undefined) {
  const categories = [...new Set(rows.map(valueOf))].sort(order);
  return { label, values: rows.map((r) => categories.indexOf(valueOf(r))),
           tickvals: categories.map((_, i) => i), ticktext: categories.map(textOf),
           range: [-0.25, Math.max(categories.length - 1, 0) + 0.25] };
};

// The dimensions of the plot over `rows` (results); rows missing a drawn metric are left out
// and counted, a metric that no row has is not drawn.
Compare.dimensions = function (rows, multiSweep) {
  const has = (field) => rows.some((r) => r[field] !== null && r[field] !== undefined);
  const metrics = [["tokens_per_s_per_chip", true], ["mfu", has("mfu")],
                   ["peak_memory_bytes_per_chip", has("peak_memory_bytes_per_chip")]]
    .filter(([, drawn]) => drawn).map(([field]) => field);
  const kept = rows.filter((r) => metrics.every((f) => r[f] !== null && r[f] !== undefined));
  const sweepLabel = (id) => Compare.cut(`#${id} ${Compare.sweeps.get(id).name}`);
  const dims = [
    ...(multiSweep ? [Compare.categorical("sweep", kept, (r) => r.sweep_id, sweepLabel, Cmp.byNumber)] : []),
    Compare.categorical("framework", kept, (r) => r.framework),
    Compare.categorical("kernels", kept, (r) => r.kernels || "reference"),
    Compare.categorical("layers", kept, (r) => r.layers || "gdn_only"),
    Compare.categorical("mode", kept, (r) => r.mode, GS.modeLabel),
    Compare.categorical("chips", kept, (r) => r.chips, String, Cmp.byNumber),
    Compare.categorical("seq_len", kept, (r) => r.seq_len, Cmp.tokens, Cmp.byNumber),
    Compare.categorical("dtype", kept, (r) => r.dtype),
    Compare.categorical("param sharding", kept, (r) => r.param_sharding),
    Compare.categorical("remat", kept, (r) => r.remat),
    { label: "tokens/s/chip", values: kept.map((r) => r.tokens_per_s_per_chip), tickformat: Compare.FIGURE_FORMAT },
  ];
  if (metrics.includes("mfu")) dims.push({ label: "MFU", values: kept.map((r) => r.mfu), tickformat: ".1%" });
  if (metrics.includes("peak_memory_bytes_per_chip")) {
    const { unit, size } = Cmp.byteUnit(Math.max(...kept.map((r) => r.peak_memory_bytes_per_chip)));
    dims.push({ label: `memory/chip (${unit})`, tickformat: Compare.FIGURE_FORMAT,
                values: kept.map((r) => r.peak_memory_bytes_per_chip / size) });
  }
  return { dims, kept, left: rows.length - kept.length };
};

Compare.cut = (text) => (text.length > Compare.SWEEP_LABEL_CHARS
  ? text.slice(0, Compare.SWEEP_LABEL_CHARS - 1) + "…" : text);

// The left margin the first axis's tick labels need (parcoords writes them left of the axis,
// into the margin, and clips what does not fit): the widest label at plotly's 10 px tick font.
Compare.firstAxisRoom = function (dim) {
  const ctx = (Cmp.canvas = Cmp.canvas || document.createElement("canvas")).getContext("2d");
  ctx.font = "10px 'Open Sans', verdana, arial, sans-serif";
  const labels = dim.ticktext || [];
  return Math.max(70, Math.ceil(Math.max(0, ...labels.map((t) => ctx.measureText(t).width))) + 24);
};

Compare.drawParcoords = function (view, rows, ids) {
  if (!ids.length) return Cmp.showEmpty(view, "pick one or more sweeps above");
  if (!rows.length) return Cmp.showEmpty(view, Cmp.NO_RESULTS);
  const { dims, kept, left } = Compare.dimensions(rows, ids.length > 1);
  if (!view.querySelector("#parcoords")) {
    view.replaceChildren(GS.el("div", { id: "parcoords", class: "cmp-plot" }),
                         GS.el("p", { class: "muted", id: "parcoords-note" }));
  }
  view.querySelector("#parcoords-note").textContent =
    `${Cmp.num(kept.length)} results (each repeat its own line), coloured by tokens/s/chip; ` +
    "drag along an axis to keep only the lines through that range. chips and seq_len are " +
    "spaced evenly over the values present; memory is the measured peak per chip." +
    (left ? ` ${Cmp.num(left)} results lack one of the figures and are not drawn.` : "");
  const tokens = kept.map((r) => r.tokens_per_s_per_chip);
  Plotly.react(view.querySelector("#parcoords"), [{
    type: "parcoords", dimensions: dims, labelangle: 0, labelside: "top",
    line: { color: tokens, colorscale: "Viridis", showscale: true,
            colorbar: { title: { text: "tokens/s/chip" }, tickformat: Compare.FIGURE_FORMAT } },
  }], { height: 440, margin: { t: 70, l: Compare.firstAxisRoom(dims[0]), r: 90, b: 30 } }, Cmp.PLOT_CONFIG);
};

// ---------------------------------------------------------------- side by side

// Grid points present in two or more of the sweeps: [{ key, sample, bySweep: Map(id → point) }].
Compare.matches = function (ids) {
  const rows = new Map();
  for (const id of ids) {
    for (const p of Cmp.points(Compare.results.get(id).rows)) {
      if (!rows.has(p.key)) rows.set(p.key, { key: p.key, sample: p, bySweep: new Map() });
      rows.get(p.key).bySweep.set(id, p);
    }
  }
  // by work, then the one-chip baseline before the CP modes, then chips and seq_len
  const order = (m) => [m.sample.work, m.sample.mode === "none" ? "" : m.sample.mode,
                        String(m.sample.chips).padStart(6, "0"),
                        String(m.sample.seq_len).padStart(11, "0")].join("|");
  return [...rows.values()].filter((m) => m.bySweep.size > 1)
    .sort((a, b) => order(a).localeCompare(order(b)));
};

Compare.settingsText = (t) => `${t.framework} · ${t.kernels || "reference"} kernels · ` +
  `${t.layers || "gdn_only"}${t.attn_cp ? " (attn " + t.attn_cp + ")" : ""} · ${t.dtype} · ` +
  `${t.param_sharding} · remat ${t.remat} · ${t.preset} ×${t.num_layers} · batch ${t.batch_size}`;

Compare.table = function (ids, matches) {
  const [ref, ...others] = ids, num = (text, attrs) => GS.el("td", { class: "num", ...attrs }, text);
  const head = ["mode", "chips", "seq_len", "framework · kernels · layers · settings · model",
                ...ids.map((id) => `#${id} tokens/s/chip`), ...others.map((id) => `#${id} ÷ #${ref}`)];
  const body = matches.map((m) => {
    const t = m.sample.sample, tps = (id) => (m.bySweep.get(id) || {}).tokensPerSPerChip;
    return GS.el("tr", { "data-key": m.key, "data-mode": t.mode, "data-chips": t.chips, "data-seq-len": t.seq_len },
      GS.el("td", {}, GS.modeLabel(t.mode)), num(t.chips), num(Cmp.tokens(t.seq_len)),
      GS.el("td", { class: "settings" }, Compare.settingsText(t)),
      ...ids.map((id) => num(Cmp.num(tps(id)), { "data-sweep": id })),
      ...others.map((id) => {
        const ratio = tps(id) === undefined || tps(ref) === undefined ? null : tps(id) / tps(ref);
        return num(Cmp.ratio(ratio), { "data-ratio-of": id, "data-ratio": ratio === null ? null : ratio,
                                       class: "num ratio" + (ratio > 1 ? " faster" : ratio < 1 ? " slower" : "") });
      }));
  });
  return GS.el("div", { class: "cmp-scroll" }, GS.el("table", { id: "compare-table", class: "cmp-table" },
    GS.el("thead", {}, GS.el("tr", {}, ...head.map((h) => GS.el("th", {}, h)))), GS.el("tbody", {}, ...body)));
};

// tokens/s/chip vs chips at one seq_len: a trace per (sweep, series), each CP mode's line
// starting at the one-chip baseline of its work. Colour and dash are the series' (mode and
// kernels; framework and decoder: GS.lineOf), the marker the sweep's (its id leads each name).
Compare.drawLines = function (div, ids, seqLen) {
  const traces = [];
  ids.forEach((id, i) => {
    const pts = Cmp.points(Compare.results.get(id).rows).filter((p) => p.seq_len === seqLen);
    const base = new Map(pts.filter((p) => p.mode === "none").map((p) => [p.work, p]));
    const cp = pts.filter((p) => p.mode !== "none");
    const groups = cp.length ? GS.groupBy(cp, (p) => p.series) : GS.groupBy(pts, (p) => p.series);
    for (const [series, ps] of groups) {
      const b = base.get(ps[0].work), line = (b && !ps.includes(b) ? [b, ...ps] : ps)
        .sort((x, y) => x.chips - y.chips);
      const look = GS.lineOf(ps[0].sample);
      traces.push({ type: "scatter", mode: "lines+markers", name: `#${id} ${series}`,
                    meta: { sweep: id, mode: ps[0].mode }, x: line.map((p) => p.chips),
                    y: line.map((p) => p.tokensPerSPerChip), line: look.line,
                    marker: { ...look.marker, symbol: Compare.SWEEP_SYMBOLS[i % Compare.SWEEP_SYMBOLS.length], size: 8 },
                    hovertemplate: "%{fullData.name}<br>%{x} chips: %{y:,.1f} tokens/s/chip<extra></extra>" });
    }
  });
  const chips = Cmp.distinct(traces.flatMap((t) => t.x));
  const legend = Cmp.legendBelow(div, traces, 340);
  return Cmp.react(div, traces, {
    title: { text: `tokens/s/chip vs chips at seq_len ${Cmp.tokens(seqLen)}`, subtitle: {
      text: "marker: sweep; " + GS.STYLE_KEY } },
    ...legend, margin: { ...legend.margin, t: 70 }, xaxis: Cmp.chipsAxis(chips),
    yaxis: { title: { text: "tokens/s/chip" }, rangemode: "tozero", ...Cmp.NUMBER_AXIS },
  });
};

Compare.drawSideBySide = function (view, ids) {
  if (ids.length < 2) return Cmp.showEmpty(view, "pick two or more sweeps to compare them side by side");
  const empty = ids.filter((id) => !Compare.results.get(id).rows.length);
  if (empty.length === ids.length) return Cmp.showEmpty(view, Cmp.NO_RESULTS);
  const matches = Compare.matches(ids);
  const seqs = Cmp.distinct(ids.flatMap((id) => Compare.results.get(id).rows.map((t) => t.seq_len)));
  const matchedSeqs = Cmp.distinct(matches.map((m) => m.sample.seq_len));
  let select = view.querySelector("#compare-seq-len");
  const chosen = select && seqs.includes(Number(select.value)) ? Number(select.value)
                                                               : (matchedSeqs.length ? matchedSeqs : seqs).at(-1);
  select = GS.el("select", { id: "compare-seq-len" },
                 ...seqs.map((s) => GS.el("option", { value: s, selected: s === chosen }, Cmp.tokens(s))));
  select.addEventListener("change", () => Compare.drawLines(view.querySelector("#compare-lines"), ids,
                                                            Number(select.value)));
  const missingText = empty.length ? `${empty.map((id) => "#" + id).join(", ")}: no succeeded trial yet. ` : "";
  view.replaceChildren(
    GS.el("p", { class: "muted" }, missingText + `Points run in two or more of these sweeps (same mode, chips, ` +
          `seq_len, framework, model, batch and step settings; repeats at their median). ` +
          `Ratios divide by #${ids[0]}, the first chosen.`),
    matches.length ? Compare.table(ids, matches)
      : GS.el("p", { class: "empty", id: "compare-no-match" }, "no grid point is in two of these sweeps"),
    GS.el("div", { class: "cmp-controls" }, GS.el("label", { for: "compare-seq-len" }, "seq_len"), select),
    GS.el("div", { id: "compare-lines", class: "cmp-plot" }));
  Compare.drawLines(view.querySelector("#compare-lines"), ids, chosen);
};

// ---------------------------------------------------------------- the page

Compare.render = async function () {
  document.body.dataset.compareState = "loading";
  const ids = Compare.chosen(), errors = document.getElementById("compare-errors");
  try {
    await Promise.all(ids.filter((id) => !Compare.results.has(id)).map(async (id) => {
      Compare.results.set(id, await Cmp.sweepResults(id));
    }));
  } catch (err) {
    errors.textContent = "cannot load results: " + err.message;
    return;
  }
  const truncated = ids.filter((id) => Compare.results.get(id).truncated);
  const interpreted = ids.reduce((n, id) => n + Compare.results.get(id).interpreted, 0);
  document.getElementById("compare-notes").textContent = [truncated.length
    ? `${truncated.map((id) => "#" + id).join(", ")}: only the first ${Cmp.num(Cmp.MAX_ROWS)} results are shown` : "",
    Cmp.interpretedNote(interpreted)].filter(Boolean).join("; ");
  Compare.drawParcoords(document.getElementById("parcoords-view"),
                        ids.flatMap((id) => Compare.results.get(id).rows), ids);
  Compare.drawSideBySide(document.getElementById("side-by-side"), ids);
  document.body.dataset.compareState = "ready";
};

Compare.choiceText = (s) => `${s.status} · ${Cmp.num(s.counts.succeeded)} succeeded · ` +
  `${s.spec.accelerator.type} · ${s.spec.modes.join(", ")}`;
Compare.choice = (s, checked) => GS.el("label", { class: "sweep-choice",
                                                  title: `#${s.id} ${s.name}: ${Compare.choiceText(s)}` },
  GS.el("input", { type: "checkbox", name: "sweep", value: s.id, checked }),
  ` #${s.id} ${s.name} `, GS.el("span", { class: "muted" }, Compare.choiceText(s)));

Compare.start = async function () {
  GS.header("/compare");
  const errors = document.getElementById("compare-errors"), picker = document.getElementById("sweep-picker");
  const problems = [];
  try {
    for (let page = 0; page < Compare.SWEEP_PAGES; page += 1) {
      const got = await GS.api(`/api/sweeps?limit=200&offset=${Compare.sweeps.size}`);
      got.data.forEach((s) => Compare.sweeps.set(s.id, s));
      if (!got.data.length || Compare.sweeps.size >= got.count) break;
    }
    const { ids, bad } = Compare.fromUrl();
    bad.forEach((value) => problems.push(`sweep=${value} is not a sweep id (use ?sweep=3&sweep=5)`));
    for (const id of ids.filter((i) => !Compare.sweeps.has(i))) {
      try { Compare.sweeps.set(id, await GS.api(`/api/sweeps/${id}`)); } catch (err) {
        problems.push(`sweep ${id}: ${err.message}`);
      }
    }
    Compare.toUrl(ids.filter((id) => Compare.sweeps.has(id)));
  } catch (err) {
    errors.textContent = "cannot list sweeps: " + err.message;
    return;
  }
  errors.textContent = problems.join("\n");
  const chosen = Compare.chosen();
  const listed = [...Compare.sweeps.values()].sort((a, b) => b.id - a.id);
  picker.replaceChildren(...(listed.length ? listed.map((s) => Compare.choice(s, chosen.includes(s.id)))
                                           : [GS.el("p", { class: "empty" }, "no sweep yet")]));
  picker.addEventListener("change", (event) => {
    const id = Number(event.target.value), now = Compare.chosen().filter((i) => i !== id);
    Compare.toUrl(event.target.checked ? [...now, id] : now);
    Compare.render();
  });
  Compare.render();
};

Compare.start();
