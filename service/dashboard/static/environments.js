// The sweep page's Environments section: what its trials measured in (GET /api/environments/{id}),
// one column per distinct environment, the keys whose values differ between them marked.
"use strict";

const Environments = (() => {
  const bodies = new Map();  // environment id → body (stored environments never change)

  function flatten(value, prefix, out) {
    for (const [key, leaf] of Object.entries(value)) {
      const name = prefix + key;
      if (leaf && typeof leaf === "object" && !Array.isArray(leaf) && Object.keys(leaf).length) {
        flatten(leaf, name + ".", out);
      } else {
        out.set(name, leaf);
      }
    }
    return out;
  }

  function text(value) {
    if (value === undefined) return "(not recorded)";
    if (value === null) return "null";
    return typeof value === "object" ? JSON.stringify(value) : String(value);
  }

  async function show(trials) {
    const section = document.getElementById("environments");
    const uses = GS.groupBy(trials.filter((t) => t.environment_id !== null && t.environment_id !== undefined),
                            (t) => t.environment_id);
    const ids = [...uses.keys()].sort((a, b) => a - b);
    if (!ids.length) {
      section.replaceChildren(GS.el("p", { class: "muted" }, "no trial has recorded an environment yet"));
      return;
    }
    await Promise.all(ids.filter((id) => !bodies.has(id)).map(async (id) => {
      bodies.set(id, (await GS.api(`/api/environments/${id}`)).body);
    }));
    const flat = ids.map((id) => flatten(bodies.get(id), "", new Map()));
    const keys = [...new Set(flat.flatMap((f) => [...f.keys()]))].sort();
    const head = GS.el("tr", {}, GS.el("th", {}, "key"), ...ids.map((id) => GS.el("th", {},
      `environment #${id} · ${uses.get(id).length} trial${uses.get(id).length === 1 ? "" : "s"}`)));
    const rows = keys.map((key) => {
      const values = flat.map((f) => text(f.get(key)));
      const changed = new Set(values).size > 1;
      return GS.el("tr", { "data-key": key, class: changed ? "changed" : null },
        GS.el("td", {}, key), ...values.map((v) => GS.el("td", { title: v }, v)));
    });
    const note = ids.length > 1 ? "rows that differ between environments are marked" :
      "every trial that recorded one measured in this environment";
    section.replaceChildren(GS.el("p", { class: "muted" }, note),
      GS.el("div", { class: "table-scroll" },
        GS.el("table", { id: "environment-table", class: "one-line" },
          GS.el("thead", {}, head), GS.el("tbody", {}, ...rows))));
  }

  return { show };
})();
