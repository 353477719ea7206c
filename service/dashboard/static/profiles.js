// Profiles on the sweep page: each trial's profile cell (the trace link, or a button that
// queues a sweep profiling the trial's point), and the profiled trials' top ops by self time
// with their step's compute / collectives / idle split (workers/profile_summary.py).
"use strict";

const Profiles = {};

const FINISHED_MEASURE = new Set(["succeeded", "failed", "oom", "timeout", "cancelled"]);

function profileSplit(s) {
  return `compute ${GS.seconds(s.compute_s)} · collectives ${GS.seconds(s.collective_s)} · ` +
         `idle ${GS.seconds(s.idle_s)} of ${GS.seconds(s.wall_s)}`;
}

async function profileAgain(t, cell) {
  cell.replaceChildren("queueing…");
  try {
    const sweep = await GS.api(`/api/trials/${t.id}/profile`, { method: "POST" });
    cell.replaceChildren(GS.el("a", { href: `/sweeps/${sweep.id}`, class: "profile-queued" },
                               `sweep ${sweep.id}`));
  } catch (err) {
    if (err.status === 401) {
      const token = window.prompt("This service needs its API token to queue a sweep:");
      if (token) { GS.setToken(token); return profileAgain(t, cell); }
    }
    cell.replaceChildren(GS.el("span", { class: "error", title: err.message }, "refused"));
  }
}

// The trials table's profile cell of trial `t`.
Profiles.cell = function (t) {
  const cell = GS.el("td", { class: "profile" });
  const p = t.profile;
  if (p && p.url) {
    cell.append(GS.el("a", { href: p.url, class: "profile-link", download: "",
                             title: profileSplit(p.summary) }, `trace (${GS.bytes(p.bytes)})`));
  } else if (p && p.status === "skipped") {  // no room under the artifact directory
    cell.append(GS.el("span", { class: "skip-reason", title: p.error || null },
                      "profile skipped"));
  } else if (p) {
    cell.append(GS.el("span", { class: "error", title: p.error || null }, "profiler failed"));
  } else if (t.kind === "measure" && FINISHED_MEASURE.has(t.status)) {
    cell.append(GS.el("button", {
      class: "secondary small profile-again",
      title: "queue a sweep of this point with profile: true (one extra profiled step)",
      onclick: () => profileAgain(t, cell),
    }, "profile"));
  }
  return cell;
};

function topOpsTable(t) {
  const rows = (t.profile.summary.top_ops || []).map((op) => GS.el("tr", {},
    GS.el("td", { class: "name", title: op.name }, op.name), GS.el("td", {}, op.category),
    GS.el("td", { class: "num" }, GS.seconds(op.self_s)), GS.el("td", { class: "num" }, op.count)));
  return GS.el("table", { class: "top-ops" },
    GS.el("thead", {}, GS.el("tr", {}, GS.el("th", {}, "op"), GS.el("th", {}, "kind"),
                              GS.el("th", {}, "self time"), GS.el("th", {}, "calls"))),
    GS.el("tbody", {}, ...rows));
}

// The profiles section: one block per profiled trial with a trace (hidden when none).
Profiles.show = function (trials) {
  const section = document.getElementById("profiles");
  const profiled = trials.filter((t) => t.profile && t.profile.url);
  section.hidden = profiled.length === 0;
  const blocks = profiled.map((t) => GS.el("div", { class: "profile-block", "data-trial-id": t.id },
    GS.el("h3", {}, `trial ${t.id} · ${t.key} `,
          GS.el("a", { href: t.profile.url, download: "" }, `trace (${GS.bytes(t.profile.bytes)})`)),
    GS.el("p", { class: "muted profile-split" },
          `profiled step (${t.profile.summary.ops}, not in the metrics): ` + profileSplit(t.profile.summary)),
    topOpsTable(t)));
  document.getElementById("profiles-list").replaceChildren(...blocks);
};

window.Profiles = Profiles;
