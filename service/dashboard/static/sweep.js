// One sweep: status, live progress, plots and the trial table.
"use strict";

const sweepId = Number(window.location.pathname.split("/").filter(Boolean).pop());
let timer = null;

// A trial's chips as its mesh: "4" (one CP group), or "4 (2×2)" for dp 2 replicas × 2 CP chips.
function meshLabel(t) {
  const dp = t.dp || 1;
  return dp > 1 ? `${t.chips} (${dp}×${t.chips / dp})` : String(t.chips);
}

function meshTitle(t) {
  const dp = t.dp || 1;
  return dp > 1 ? `${dp} data-parallel replicas × ${t.chips / dp} CP chip${t.chips === dp ? "" : "s"}` +
                  ` each; batch ${t.batch_size} per replica, ${t.global_batch_size} per step` : null;
}

function trialRow(t, repeated) {
  const num = (v, title) => GS.el("td", { class: "num", title: title || null }, v);
  const speed = (text, title) => num(GS.speed(t, text), GS.interpreted(t) ? GS.INTERPRETED_TITLE : title);
  const loss = t.loss_first === null ? "" : `${GS.num(t.loss_first, 4)} → ${GS.num(t.loss_last, 4)}`;
  const settings = `${t.dtype} · ${t.param_sharding} · remat ${t.remat}` +
                   (t.layers === "hybrid" ? ` · hybrid${t.attn_cp ? ", attn " + t.attn_cp : ""}` : "") +
                   (t.layout === "zigzag" ? " · zigzag" : "") +
                   (t.kernels === "fused" ? " · " + GS.kernelsLabel(t) : "") +
                   ((t.documents || "single") !== "single" ? ` · documents ${t.documents}` : "") +
                   (repeated ? ` · repeat ${t.repeat}` : "");
  // what a reader came for first (status or why not, the speed, memory), then what the trial was
  return GS.el("tr", { "data-trial-id": t.id, "data-status": t.status,
                       "data-attempts": t.attempt_history.length },
    num(t.id), GS.el("td", {}, GS.badge(t.status)), GS.reasonCell(t),
    speed(GS.num(t.tokens_per_s_per_chip)), speed(GS.pct(t.mfu)), speed(GS.stepTime(t)),
    num(GS.bytes(t.peak_memory_bytes_per_chip), t.memory_source),
    GS.el("td", {}, t.framework),
    GS.el("td", { title: t.mode !== "none" ? null : (t.dp || 1) > 1
                    ? "one chip per replica, no context parallelism: pure data parallel"
                    : "one chip, no context parallelism: the baseline" }, t.mode),
    num(meshLabel(t), meshTitle(t)), num(GS.num(t.seq_len, 21)), GS.el("td", {}, settings),
    GS.attempts(t),
    speed(GS.pct(t.scaling_efficiency), t.baseline_key ? "baseline: " + t.baseline_key : null),
    GS.compileCell(t),
    num(GS.bytes(t.estimated_memory_bytes_per_chip), t.estimated_memory_source),
    num(GS.bytes(t.predicted_memory_bytes_per_chip)),
    num(GS.bytes(t.cp_comm_bytes_per_step_per_chip)),
    num(GS.bytes(t.grad_sync_bytes_per_step_per_chip)), num(loss),
    num(GS.num(t.max_rel_err), t.verified_seq_len ? `verified on ${t.verified_seq_len} tokens` : null),
    GS.el("td", {}, t.device_name || ""),
    num(t.environment_id === null ? "" : "#" + t.environment_id), Profiles.cell(t));
}

function showSweep(s, trials) {
  document.title = "gdn-sweep · " + s.name;
  document.getElementById("sweep-name").textContent = s.name;
  document.getElementById("sweep-status").replaceChildren(GS.badge(s.status));
  document.getElementById("sweep-progress").replaceChildren(GS.progress(s.trials_done, s.trials_total));
  const shown = Object.entries(s.counts).filter(([, n]) => n).map(([k, n]) => `${k} ${n}`);
  document.getElementById("sweep-counts").textContent = `${s.trials_done} / ${s.trials_total} done · ` + shown.join(" · ");
  document.getElementById("sweep-timing").textContent = Timing.describe(s, trials, Date.now());
  const m = s.spec.model, a = s.spec.accelerator;
  document.getElementById("sweep-spec").textContent =
    `preset ${m.preset}${m.num_layers ? ` (${m.num_layers} layers)` : ""} · batch ${s.spec.batch_size}` +
    ((s.spec.dp || [1]).some((d) => d > 1) ? ` per replica · dp ${s.spec.dp.join(", ")}` : "") + " · " +
    `dtypes ${s.spec.dtypes.join(", ")} · param shardings ${s.spec.param_shardings.join(", ")} · ` +
    `remats ${s.spec.remats.join(", ")} · ${s.spec.warmup_steps} warm-up + ${s.spec.steps} measured steps · ` +
    `${a.kind}/${a.type} · frameworks ${s.spec.frameworks.join(", ")} · modes ${s.spec.modes.join(", ")}` +
    ` · layers ${(s.spec.layers || ["gdn_only"]).join(", ")}` +
    ((s.spec.layers || []).includes("hybrid") ? ` · attention CP ${s.spec.attn_cps.join(", ")}` : "") +
    ` · layouts ${(s.spec.layouts || ["contiguous"]).join(", ")}` +
    ` · kernels ${(s.spec.kernels || ["reference"]).join(", ")}` +
    ` · documents ${(s.spec.documents || ["single"]).join(", ")}` +
    (s.spec.repeats > 1 ? ` · ${s.spec.repeats} repeats of every point` : "") +
    (s.spec.profile ? " · profiled (one extra step per trial)" : "") +
    (s.spec.one_chip_baseline && s.spec.chips.includes(1) ? " · one-chip baseline (mode none) shared by every mode" : "");
  document.getElementById("sweep-error").textContent = s.error || "";
  document.getElementById("cancel").hidden = GS.FINAL_SWEEP.has(s.status) || s.status === "cancelling";
}

async function refresh() {
  try {
    const [sweep, trials] = await Promise.all([
      GS.api(`/api/sweeps/${sweepId}`), GS.api(`/api/sweeps/${sweepId}/trials?limit=10000`)]);
    showSweep(sweep, trials.data);
    const repeated = sweep.spec.repeats > 1;
    document.querySelector("#trials tbody").replaceChildren(...trials.data.map((t) => trialRow(t, repeated)));
    Plots.drawAll(sweep, trials.data);
    await Environments.show(trials.data);
    Profiles.show(trials.data);
    document.body.dataset.sweepStatus = sweep.status;
    if (GS.FINAL_SWEEP.has(sweep.status) && timer !== null) {
      clearInterval(timer);
      timer = null;
    }
  } catch (err) {
    document.getElementById("sweep-error").textContent = "cannot load sweep: " + err.message;
  }
}

async function cancel() {
  if (!window.confirm("Cancel this sweep? Running trials are stopped.")) return;
  try {
    await GS.api(`/api/sweeps/${sweepId}/cancel`, { method: "POST" });
  } catch (err) {
    if (err.status === 401) {
      const token = window.prompt("This service needs its API token to cancel:");
      if (token) { GS.setToken(token); return cancel(); }
    }
    document.getElementById("sweep-error").textContent = err.message;
  }
  refresh();
}

GS.header("/sweep");
document.getElementById("results-link").href = "/results?sweep_id=" + sweepId;
document.getElementById("cancel").addEventListener("click", cancel);
refresh().then(() => { if (!GS.FINAL_SWEEP.has(document.body.dataset.sweepStatus)) timer = setInterval(refresh, 2000); });
