"""Summarise one profiled training step from its Chrome / Perfetto trace (the JSON both
torch.profiler's export_chrome_trace and jax.profiler's perfetto trace write): the top ops by
self time, and the step's time split into compute, collectives and idle.

One definition for both frameworks, read from the trace itself:
- ops: the events that are device work. torch: CUDA kernels when the trace has any, else the
  CPU ops (`cat` "kernel" / "cpu_op"); JAX: the XLA ops (events whose args name an `hlo_op`,
  on the device lanes on GPU/TPU, on XLA's CPU client threads on CPU).
- self time: an op's duration minus that of the ops nested in it on the same thread/stream.
- collective: an op whose name is a collective (COLLECTIVE_PATTERN: all-gather, all-to-all,
  ppermute / collective-permute, all-reduce, reduce-scatter, psum, send, recv, broadcast, the
  NCCL / gloo / c10d ops); every other op is compute.
- busy: the time at least one op ran (the union of their intervals, all lanes); idle: the
  profiled step's wall time minus busy (host overhead, waiting, launch gaps).
compute_s + collective_s can exceed wall_s where lanes run in parallel (several devices or
threads); busy_s cannot.
"""

from __future__ import annotations

import re
from collections import defaultdict

from gdn_core.train_config import check_framework

COLLECTIVE_PATTERN = re.compile(
    r"all[-_ ]?gather|all[-_ ]?to[-_ ]?all|ppermute|collective[-_ ]?permute|all[-_ ]?reduce"
    r"|reduce[-_ ]?scatter|psum|send|recv|broadcast|nccl|gloo|c10d", re.IGNORECASE)
TOP_OPS = 10
"""Ops listed in a summary, by self time."""


def op_events(trace: dict, framework: str) -> tuple[list[dict], str]:
    """(the trace's op events, what they are) for `framework` ("torch" or "jax")."""
    check_framework(framework)
    complete = [e for e in trace.get("traceEvents", [])
                if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]
    if framework == "jax":
        return [e for e in complete if "hlo_op" in (e.get("args") or {})], "XLA ops"
    kernels = [e for e in complete if e.get("cat") == "kernel"]
    if kernels:
        return kernels, "CUDA kernels"
    return [e for e in complete if e.get("cat") == "cpu_op"], "CPU ops"


def self_times_us(ops: list[dict]) -> list[tuple[str, float, bool]]:
    """(name, self time in µs, counts as an occurrence) of each op: its duration minus its
    direct children's, a child being an op that starts and ends within it on the same lane
    (pid, tid). An op nested directly in one of its own name (a dispatcher re-entering the
    same op) is not another occurrence, as torch's key_averages counts it."""
    lanes: dict[tuple, list[dict]] = defaultdict(list)
    for op in ops:
        lanes[(op.get("pid"), op.get("tid"))].append(op)
    out = []
    for lane in lanes.values():
        lane.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[list] = []  # [end, name, duration, children's time, counts]
        for op in lane:
            start, dur = float(op["ts"]), float(op["dur"])
            while stack and stack[-1][0] <= start:
                _, name, total, children, counts = stack.pop()
                out.append((name, total - children, counts))
            name = str(op.get("name", "?"))
            counts = not stack or stack[-1][1] != name
            if stack:
                stack[-1][3] += dur
            stack.append([start + dur, name, dur, 0.0, counts])
        out.extend((name, total - children, counts)
                   for _, name, total, children, counts in reversed(stack))
    return out


def busy_us(ops: list[dict]) -> float:
    """Length of the union of the ops' intervals (µs)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ops):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def category(name: str) -> str:
    """"collective" or "compute" (COLLECTIVE_PATTERN)."""
    return "collective" if COLLECTIVE_PATTERN.search(name) else "compute"


def summarise_trace(trace: dict, *, framework: str, wall_s: float, top: int = TOP_OPS) -> dict:
    """The profiled step's summary (seconds): wall_s, busy_s, idle_s, compute_s,
    collective_s, ops (what counted as an op) and top_ops [{name, category, self_s, count}]
    by self time, largest first."""
    ops, what = op_events(trace, framework)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    totals = {"compute": 0.0, "collective": 0.0}
    for name, self_us, counts in self_times_us(ops):
        by_name[name][0] += self_us
        by_name[name][1] += counts
        totals[category(name)] += self_us
    busy_s = busy_us(ops) / 1e6
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    return {
        "ops": what, "op_events": len(ops), "wall_s": wall_s, "busy_s": busy_s,
        "idle_s": max(0.0, wall_s - busy_s), "compute_s": totals["compute"] / 1e6,
        "collective_s": totals["collective"] / 1e6,
        "top_ops": [{"name": name, "category": category(name), "self_s": self_us / 1e6,
                     "count": count} for name, (self_us, count) in ranked],
    }


__all__ = ["COLLECTIVE_PATTERN", "TOP_OPS", "busy_us", "category", "op_events",
           "self_times_us", "summarise_trace"]
