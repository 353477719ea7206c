// The regressions page: GET /api/regressions for every schedule or the one in ?schedule=,
// each open regression (worst first) as a card — its size, levels, first run, environment
// diff — over a plot of its series with the shift marked; the improvements in a table.
"use strict";

const METRIC_NAMES = { step_time_s: "step time", tokens_per_s_per_chip: "tokens/s/chip",
                       peak_memory_bytes_per_chip: "peak memory / chip" };

function figure(value, metric) {
  if (metric === "step_time_s") return GS.seconds(value);
  if (metric === "peak_memory_bytes_per_chip") return GS.bytes(value);
  return GS.num(value) + " tokens/s";
}

const change = (r) => (r.relative_change >= 0 ? "+" : "") + GS.num(100 * r.relative_change) + "%";
const runText = (run) => `sweep ${run.sweep_id} (${GS.time(run.at)})`;

function environmentText(diff) {
  if (diff === null) return "environment diff: not recorded (results carry no environment yet)";
  const changed = Object.entries(diff).map(([k, v]) => `${k}: ${v.before} → ${v.after}`);
  return "environment diff: " + (changed.length ? changed.join("; ") : "no change");
}

// The series as points with their repeats' spread, each level as a line over its runs, and a
// dashed line at the first run of the new level.
function plot(div, r) {
  const x = r.points.map((p) => p.at), first = r.points.findIndex((p) => p.sweep_id === r.first_run.sweep_id);
  const text = r.points.map((p) => `sweep ${p.sweep_id}<br>${figure(p.value, r.metric)}`);
  const traces = [
    { x, y: r.points.map((p) => p.value), text, hoverinfo: "text", mode: "markers", name: "run",
      type: "scatter", marker: { color: "#1d2330" },
      error_y: { type: "data", symmetric: false, color: "#8a94a3",
                 array: r.points.map((p) => p.high - p.value),
                 arrayminus: r.points.map((p) => p.value - p.low) } },
    { x: x.slice(0, first), y: x.slice(0, first).map(() => r.before), mode: "lines", type: "scatter",
      name: "level before", line: { color: "#2ca02c" }, hoverinfo: "skip" },
    { x: x.slice(first), y: x.slice(first).map(() => r.after), mode: "lines", type: "scatter",
      name: "level after", line: { color: "#d62728" }, hoverinfo: "skip" },
  ];
  const layout = {
    height: 300, margin: { l: 70, r: 20, t: 10, b: 40 }, showlegend: true,
    legend: { orientation: "h", y: -0.2 },
    yaxis: { title: { text: METRIC_NAMES[r.metric] }, rangemode: "tozero" },
    shapes: [{ type: "line", xref: "x", yref: "paper", x0: x[first], x1: x[first], y0: 0, y1: 1,
               line: { dash: "dash", color: "#d62728", width: 1 } }],
  };
  return Plotly.react(div, traces, layout, { responsive: true, displaylogo: false });
}

function card(r) {
  const div = GS.el("div", { class: "plot" });
  const section = GS.el("section", { class: "regression", "data-metric": r.metric,
                                     "data-series": r.series, "data-first-sweep": r.first_run.sweep_id },
    GS.el("h3", {}, GS.el("span", { class: "change" }, change(r)), " ", METRIC_NAMES[r.metric], " ",
          r.new ? GS.el("span", { class: "badge s-new" }, "new") : null, " ",
          GS.el("span", { class: "muted" }, r.series)),
    GS.el("p", { class: "facts" }, `${figure(r.before, r.metric)} → ${figure(r.after, r.metric)}`,
          ` from ${runText(r.first_run)}, ${r.runs_after} run(s) at the new level; `,
          `run-to-run spread ±${GS.num(100 * r.spread)}%`,
          r.schedule_name ? ` · schedule ${r.schedule_name}` : ""),
    GS.el("p", { class: "environment muted" }, environmentText(r.environment_diff)), div);
  return { section, draw: () => plot(div, r) };
}

function improvementRow(r) {
  return GS.el("tr", { "data-metric": r.metric },
    GS.el("td", { class: "num" }, change(r)), GS.el("td", {}, METRIC_NAMES[r.metric]),
    GS.el("td", {}, `${figure(r.before, r.metric)} → ${figure(r.after, r.metric)}`),
    GS.el("td", {}, runText(r.first_run)), GS.el("td", { class: "name", title: r.series }, r.series),
    GS.el("td", {}, r.schedule_name || "—"));
}

async function load() {
  const schedule = new URLSearchParams(location.search).get("schedule") || "";
  document.getElementById("f-schedule").value = schedule;
  const errors = document.getElementById("errors");
  errors.textContent = "";
  try {
    const report = await GS.api("/api/regressions" + (schedule ? "?schedule=" + encodeURIComponent(schedule) : ""));
    document.getElementById("summary").textContent = report.count
      ? `${report.count} open regression(s), ${report.new} new, worst first; ${report.series} series`
      : `no open regression in ${report.series} series`;
    const cards = report.data.map(card);
    document.getElementById("regressions").replaceChildren(...cards.map((c) => c.section));
    await Promise.all(cards.map((c) => c.draw()));
    document.querySelector("#improvements tbody").replaceChildren(...report.improvements.map(improvementRow));
    document.getElementById("no-improvements").hidden = report.improvements.length > 0;
  } catch (err) {
    errors.textContent = "cannot load regressions: " + err.message;
  }
}

async function init() {
  GS.header("/regressions");
  const select = document.getElementById("f-schedule");
  try {
    const schedules = await GS.api("/api/schedules?offset=0&limit=200");
    const names = [...new Set(schedules.data.map((s) => s.name))].sort();
    select.append(...names.map((n) => GS.el("option", { value: n }, n)));
  } catch (err) {
    document.getElementById("errors").textContent = "cannot list schedules: " + err.message;
  }
  select.addEventListener("change", () => {
    const url = new URL(location.href);
    if (select.value) url.searchParams.set("schedule", select.value); else url.searchParams.delete("schedule");
    history.replaceState(null, "", url);
    load().then(() => { document.body.dataset.regressionsState = "ready"; });
  });
  await load();
  document.body.dataset.regressionsState = "ready";
}

init();
