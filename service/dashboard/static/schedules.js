// The schedules page: saved sweeps started on a cron expression in a time zone (GET/POST
// /api/schedules), their next run in the browser's time and in UTC, the sweeps their ticks
// started, pause / resume / delete. The API's 422 is shown beside the field it names.
"use strict";

const PAGE = 20;
const TICKS_SHOWN = 5;
const EXAMPLE_SPEC = {
  name: "nightly tiny", frameworks: ["torch"], modes: ["all_gather", "p2p"], chips: [1, 2],
  seq_lens: [256, 512], model: { preset: "tiny", num_layers: 1 },
  accelerator: { kind: "cpu", type: "cpu" },
};
let offset = 0;
let options = null;
let refreshing = false;
let refreshAgain = false;

const field = (name) => document.getElementById("f-" + name);

// ---------------------------------------------------------------- cron in words

const DAY_NAMES = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
                   "Sunday"];
const DAY_NUMBERS = { sun: 0, mon: 1, tue: 2, wed: 3, thu: 4, fri: 5, sat: 6 };

function dayName(text) {
  const n = /^\d$/.test(text) ? Number(text) : DAY_NUMBERS[text.toLowerCase()];
  return n === undefined || n > 7 ? null : DAY_NAMES[n];
}

// "1-5" → "Monday to Friday", "1,3" → "Monday and Wednesday"; null for anything else.
function daysInWords(dow) {
  const parts = dow.split(",").map((part) => {
    const [from, to, extra] = part.split("-");
    if (extra !== undefined) return null;
    if (to === undefined) return dayName(from);
    return dayName(from) && dayName(to) ? `${dayName(from)} to ${dayName(to)}` : null;
  });
  if (parts.includes(null)) return null;
  return parts.length === 1 ? parts[0] : parts.slice(0, -1).join(", ") + " and " + parts.at(-1);
}

// The common cron shapes in words ("every day at 02:00"); "" for the others, which are shown
// as written (the API, with croniter, is the judge of what a cron expression means).
function cronInWords(expr) {
  const f = expr.trim().split(/\s+/);
  if (f.length !== 5) return "";
  const [minute, hour, dom, month, dow] = f;
  const number = /^\d+$/, every = /^\*\/(\d+)$/;
  const anyDay = dom === "*" && month === "*" && dow === "*";
  if (f.every((x) => x === "*")) return "every minute";
  if (every.test(minute) && hour === "*" && anyDay) return `every ${minute.slice(2)} minutes`;
  if (number.test(minute) && hour === "*" && anyDay) return `every hour at minute ${Number(minute)}`;
  if (!number.test(minute) || !number.test(hour)) return "";
  const at = `at ${hour.padStart(2, "0")}:${minute.padStart(2, "0")}`;
  if (anyDay) return `every day ${at}`;
  if (dom === "*" && month === "*" && daysInWords(dow)) return `every ${daysInWords(dow)} ${at}`;
  if (number.test(dom) && month === "*" && dow === "*") return `on day ${Number(dom)} of every month ${at}`;
  return "";
}

function whenInWords(cron, timezone) {
  const words = cronInWords(cron);
  return words ? `${words}, ${timezone} time` : `cron in ${timezone} time`;
}

// ---------------------------------------------------------------- times

const utcText = (iso) => new Date(iso).toISOString().slice(0, 16).replace("T", " ") + " UTC";
const localText = (iso) => new Date(iso).toLocaleString(undefined, {
  weekday: "short", year: "numeric", month: "short", day: "numeric", hour: "2-digit",
  minute: "2-digit", timeZoneName: "short" });

function untilText(iso) {
  const s = (Date.parse(iso) - Date.now()) / 1000;
  return s <= 0 ? "due now" : "in " + GS.seconds(Math.max(60, s));
}

// ---------------------------------------------------------------- the form

function clearErrors() {
  for (const slot of document.querySelectorAll(".field-error")) slot.textContent = "";
  for (const input of document.querySelectorAll(".invalid")) {
    input.classList.remove("invalid");
    input.removeAttribute("aria-invalid");
  }
  document.getElementById("create-errors").textContent = "";
}

function fieldError(name, message) {
  const slot = document.getElementById("e-" + name);
  if (!slot) return false;
  slot.textContent = (slot.textContent ? slot.textContent + "\n" : "") + message;
  const input = field(name);
  if (input) { input.classList.add("invalid"); input.setAttribute("aria-invalid", "true"); }
  return true;
}

// A 422's items beside the fields they name (loc = ["body", field, ...]; inside the spec,
// prefixed with the path in it: "chips.0: ..."); the rest, and other failures, under the form.
function showErrors(err) {
  const general = [];
  if (err.status === 422 && err.data && Array.isArray(err.data.detail)) {
    for (const d of err.data.detail) {
      const [, name, ...path] = d.loc || [];
      const msg = String(d.msg || "").replace(/^Value error, /, "");
      if (!fieldError(name, path.length ? `${path.join(".")}: ${msg}` : msg)) {
        general.push(`${(d.loc || []).filter((p) => p !== "body").join(".") || "request"}: ${msg}`);
      }
    }
  } else {
    general.push(err.message);
  }
  document.getElementById("create-errors").textContent = general.join("\n");
}

function formBody() {
  let spec;
  try {
    spec = JSON.parse(field("spec").value);
  } catch (e) {
    fieldError("spec", "not JSON: " + e.message);
    return null;
  }
  return {
    name: field("name").value, cron: field("cron").value, timezone: field("timezone").value,
    spec, paused: field("paused").checked, allow_overlap: field("allow_overlap").checked,
    webhook_url: field("webhook_url").value.trim() || null,
  };
}

async function submit(event) {
  event.preventDefault();
  clearErrors();
  const body = formBody();
  if (!body) return;
  if (options && options.auth_required) GS.setToken(document.getElementById("token").value);
  const button = document.getElementById("create-submit");
  button.disabled = true;
  try {
    const created = await GS.api("/api/schedules", { method: "POST", body });
    document.getElementById("create-status").textContent = `saved schedule ${created.id}`;
    offset = 0;
    await refresh();
  } catch (err) {
    showErrors(err);
  } finally {
    button.disabled = false;
  }
}

function showCronWords() {
  const words = cronInWords(field("cron").value);
  document.getElementById("cron-words").textContent = words ? words + ", " +
    (field("timezone").value.trim() || "UTC") + " time" : "";
}

async function offerRecentSpecs() {
  try {
    const recent = await GS.api("/api/sweeps?offset=0&limit=20");
    const select = document.getElementById("spec-from");
    select.append(...recent.data.map((s) => GS.el("option", { value: s.id }, `#${s.id} ${s.name}`)));
    select.addEventListener("change", () => {
      const chosen = recent.data.find((s) => String(s.id) === select.value);
      field("spec").value = JSON.stringify(chosen ? chosen.spec : EXAMPLE_SPEC, null, 2);
      if (!field("name").value && chosen) field("name").value = chosen.name;
    });
  } catch (err) {
    document.getElementById("create-status").textContent = "cannot list recent sweeps: " + err.message;
  }
}

// ---------------------------------------------------------------- the list

function tickItem(run, statuses) {
  const due = GS.time(run.due_at);
  if (run.outcome === "created" && run.sweep_id !== null) {
    const status = statuses.get(run.sweep_id);
    return GS.el("li", { "data-sweep-id": run.sweep_id },
      GS.el("a", { href: "/sweeps/" + Number(run.sweep_id) }, "sweep " + run.sweep_id), " ",
      status ? GS.badge(status) : null, " ", GS.el("span", { class: "muted" }, due));
  }
  if (run.outcome === "skipped_overlap") {
    return GS.el("li", { class: "muted", title: "its previous sweep was still queued or running" },
                 `skipped ${due}: previous sweep still open`);
  }
  if (run.outcome === "failed") {
    return GS.el("li", { class: "failed" }, `failed ${due}: ${run.error || ""}`);
  }
  return GS.el("li", { class: "muted" }, `${run.outcome} ${due} (sweep since deleted)`);
}

function scheduleRow(s, statuses) {
  const runs = s.runs.slice(0, TICKS_SHOWN);
  const more = s.sweeps_created - runs.filter((r) => r.sweep_id !== null).length;
  const nextRun = s.next_run_at === null ? [GS.el("span", { class: "muted" }, "— (paused)")] : [
    GS.el("div", { class: "next-local" }, localText(s.next_run_at), " ",
          GS.el("span", { class: "muted" }, "(" + untilText(s.next_run_at) + ")")),
    GS.el("div", { class: "next-utc muted" }, utcText(s.next_run_at))];
  return GS.el("tr", { "data-schedule-id": s.id, "data-paused": String(s.paused) },
    GS.el("td", { class: "num" }, s.id),
    GS.el("td", { class: "name" }, s.name),
    GS.el("td", { class: "when" }, GS.el("div", {}, whenInWords(s.cron, s.timezone)),
          GS.el("code", { class: "muted" }, `${s.cron} · ${s.timezone}`)),
    GS.el("td", { class: "next-run" }, nextRun),
    GS.el("td", { class: "state" }, GS.badge(s.paused ? "paused" : "active"),
          s.allow_overlap ? GS.el("div", { class: "muted" }, "overlap allowed") : null,
          webhookState(s)),
    GS.el("td", { class: "last-run" }, s.last_run_at ? GS.time(s.last_run_at) : "never"),
    GS.el("td", { class: "ticks" }, runs.length ? GS.el("ul", { class: "ticks" },
          runs.map((r) => tickItem(r, statuses))) : GS.el("span", { class: "muted" }, "none yet"),
          more > 0 ? GS.el("div", { class: "muted" }, `${s.sweeps_created} sweeps in all`) : null),
    GS.el("td", { class: "row-actions" },
      GS.el("button", { class: "secondary toggle", type: "button",
                        onclick: () => act(s, s.paused ? "resume" : "pause") },
            s.paused ? "Resume" : "Pause"),
      GS.el("button", { class: "secondary delete", type: "button", onclick: () => remove(s) },
            "Delete")));
}

// The webhook and how its latest delivery went (the error whole in the tooltip).
function webhookState(s) {
  if (!s.webhook_url) return null;
  const last = s.webhook_status === null ? "no delivery yet"
    : `${s.webhook_status} ${GS.time(s.webhook_at)}` + (s.webhook_error ? `: ${s.webhook_error}` : "");
  return GS.el("div", { class: "webhook " + (s.webhook_status === "failed" ? "failed" : "muted"),
                        title: `${s.webhook_url}\n${last}` }, "webhook ", GS.badge(s.webhook_status || "set"),
               s.webhook_error ? GS.el("div", { class: "webhook-error" }, s.webhook_error) : null);
}

// Status of the sweeps the page's schedules started (one request per schedule that has any).
async function sweepStatuses(schedules) {
  const statuses = new Map();
  await Promise.all(schedules.filter((s) => s.runs.some((r) => r.sweep_id !== null)).map(async (s) => {
    const page = await GS.api(`/api/sweeps?schedule_id=${Number(s.id)}&offset=0&limit=${TICKS_SHOWN}`);
    for (const sweep of page.data) statuses.set(sweep.id, sweep.status);
  }));
  return statuses;
}

// One refresh at a time; one asked for meanwhile (after a pause, say) runs once it ends, so
// the table never stays on a list read before the change.
async function refresh() {
  if (refreshing) { refreshAgain = true; return; }
  refreshing = true;
  const info = document.getElementById("page-info");
  try {
    const page = await GS.api(`/api/schedules?offset=${offset}&limit=${PAGE}`);
    const statuses = await sweepStatuses(page.data);
    document.querySelector("#schedules tbody").replaceChildren(
      ...page.data.map((s) => scheduleRow(s, statuses)));
    info.textContent = page.count ? `${offset + 1}–${offset + page.data.length} of ${page.count}`
      : "no schedules yet";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + PAGE >= page.count;
  } catch (err) {
    info.textContent = "cannot load schedules: " + err.message;
  } finally {
    refreshing = false;
  }
  if (refreshAgain) {
    refreshAgain = false;
    await refresh();
  }
}

async function withToken(call) {
  try {
    return await call();
  } catch (err) {
    if (err.status !== 401) throw err;
    const token = window.prompt("This service needs its API token:");
    if (!token) throw err;
    GS.setToken(token);
    return call();
  }
}

async function act(schedule, action) {
  const errors = document.getElementById("list-errors");
  errors.textContent = "";
  try {
    await withToken(() => GS.api(`/api/schedules/${Number(schedule.id)}/${action}`, { method: "POST" }));
  } catch (err) {
    errors.textContent = `${action} schedule ${schedule.id}: ${err.message}`;
  }
  await refresh();
}

async function remove(schedule) {
  if (!window.confirm(`Delete schedule ${schedule.id} "${schedule.name}"? The sweeps it started stay.`)) return;
  const errors = document.getElementById("list-errors");
  errors.textContent = "";
  try {
    await withToken(() => GS.api(`/api/schedules/${Number(schedule.id)}`, { method: "DELETE" }));
  } catch (err) {
    errors.textContent = `delete schedule ${schedule.id}: ${err.message}`;
  }
  await refresh();
}

// ---------------------------------------------------------------- start

async function init() {
  GS.header("/schedules");
  const browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const zones = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : [];
  document.getElementById("timezones").replaceChildren(
    ...["UTC", ...zones.filter((z) => z !== "UTC")].map((z) => GS.el("option", { value: z })));
  field("timezone").value = browserZone;
  field("spec").value = JSON.stringify(EXAMPLE_SPEC, null, 2);
  const form = document.getElementById("create-form");
  form.addEventListener("submit", submit);
  form.addEventListener("input", showCronWords);
  showCronWords();
  document.getElementById("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE); refresh(); });
  document.getElementById("next").addEventListener("click", () => { offset += PAGE; refresh(); });
  try {
    options = await GS.api("/api/options");
    document.getElementById("token-box").hidden = !options.auth_required;
    document.getElementById("token").value = GS.token();
  } catch (err) {
    document.getElementById("create-status").textContent = "cannot load options: " + err.message;
  }
  await Promise.all([refresh(), offerRecentSpecs()]);
  document.body.dataset.schedulesState = "ready";
  setInterval(refresh, 5000);
}

init();
