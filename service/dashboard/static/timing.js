// How long a sweep has waited or run, and an estimate of how long it has left.
"use strict";

const Timing = {};
Timing.RAN = new Set(["succeeded", "failed", "oom", "timeout"]);

// Seconds from the ISO time `from` to `to` (ISO) or, without it, to `now` (ms since the epoch).
Timing.span = (from, to, now) => Math.max(0, ((to ? Date.parse(to) : now) - Date.parse(from)) / 1000);

// Seconds a running sweep has left, estimated from the trials that ran: they took `mean`
// seconds each, `parallel` at a time (their summed durations over the wall time they span);
// a pending trial takes a mean, a running one what is left of a mean. null until one ran.
Timing.eta = function (trials, now) {
  const ran = trials.filter((t) => Timing.RAN.has(t.status) && t.started_at && t.finished_at);
  const pending = trials.filter((t) => t.status === "pending").length;
  const running = trials.filter((t) => t.status === "running" && t.started_at);
  if (!ran.length || !(pending + running.length)) return null;
  const total = ran.reduce((sum, t) => sum + Timing.span(t.started_at, t.finished_at), 0);
  const wall = (Math.max(...ran.map((t) => Date.parse(t.finished_at))) -
                Math.min(...ran.map((t) => Date.parse(t.started_at)))) / 1000;
  const mean = total / ran.length, parallel = wall > 0 ? Math.max(1, total / wall) : 1;
  const work = pending * mean + running.reduce(
    (sum, t) => sum + Math.max(0, mean - Timing.span(t.started_at, null, now)), 0);
  return { seconds: work / parallel, mean, parallel, ran: ran.length, left: pending + running.length };
};

// A wall-clock span to the second: "42 s", "3 min 12 s".
Timing.clock = (s) => (s < 60 ? `${Math.round(s)} s` : GS.seconds(s));

// Where a sweep waits, how long it has run, or how long it took: "#2 in the queue · waited
// 40 s" (`long`: "queue position 2 (1 = next) · waiting 40 s"), "running for 3 min 12 s",
// "took 12 min 5 s".
Timing.elapsed = function (sweep, now, long) {
  if (sweep.status === "queued") {
    const waited = Timing.clock(Timing.span(sweep.created_at, null, now));
    return long ? `queue position ${sweep.queue_position} (1 = next) · waiting ${waited}`
                : `#${sweep.queue_position} in the queue · waiting ${waited}`;
  }
  if (!sweep.started_at) return GS.FINAL_SWEEP.has(sweep.status) ? "never started" : "";
  if (GS.FINAL_SWEEP.has(sweep.status)) return "took " + Timing.clock(Timing.span(sweep.started_at, sweep.finished_at));
  return "running for " + Timing.clock(Timing.span(sweep.started_at, null, now));
};

// The sweep page's line: the list's, and for a running sweep the time left (an estimate).
Timing.describe = function (sweep, trials, now) {
  const line = Timing.elapsed(sweep, now, true);
  if (sweep.status !== "running") return line;
  const eta = Timing.eta(trials, now);
  if (!eta) return line + " · time left: estimated once a trial has run";
  return line + ` · about ${Timing.clock(eta.seconds)} left — an estimate: the ${eta.ran} trial` +
         `${eta.ran === 1 ? "" : "s"} that ran took ${GS.seconds(eta.mean)} each on average, ` +
         `${GS.num(eta.parallel, 2)} at a time; ${eta.left} to go`;
};
