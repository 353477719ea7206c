"""Bytes each chip receives in collectives, read from a compiled XLA program's HLO text.

Per collective instruction, with G the size of the chip's replica group and S the bytes of the
instruction's operands (looked up by name, so sync ops, async `-start` ops — whose results are
tuples of buffers — and combined tuple-shaped ops are all sized the same way):

    all-gather          (G−1)·S           every other member's shard
    all-to-all          (G−1)/G·S         all but the block the chip keeps
    reduce-scatter      (G−1)/G·S         ring: G−1 steps of S/G
    all-reduce          2·(G−1)/G·S       ring convention: reduce-scatter then all-gather
    collective-permute  S                 for each chip that is a target in source_target_pairs
    collective-broadcast S                for each group member other than the first

`-done` halves of async pairs are skipped (counted once, at `-start`). A collective inside a
while loop counts once per trip when XLA recorded known_trip_count, else once (flagged).
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
               "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16, "token": 0}
COLLECTIVES = ("all-gather", "all-to-all", "reduce-scatter", "all-reduce", "collective-permute",
               "collective-broadcast")

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s+(?P<op>[a-z][\w\-]*)\("
    r"(?P<operands>[^)]*)\)(?P<attrs>.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(?:\(.*\)\s*->.*)?\{\s*$")
_CALLEES = re.compile(r"\b(body|condition|to_apply|calls|branch_computations|true_computation|"
                      r"false_computation)=(\{[^}]*\}|%?[\w.\-]+)")
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO shape, summing every array of a tuple (layouts and comments ignored)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        if dtype in DTYPE_BYTES:
            total += DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


def _replica_groups(attrs: str, num_chips: int) -> list[list[int]]:
    """Parse replica_groups: explicit {{0,1},{2,3}}, iota [G,S]<=[dims]T(perm), or {} (all)."""
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if iota:
        groups, size = int(iota[1]), int(iota[2])
        dims = [int(d) for d in iota[3].split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if iota[4]:
            ids = ids.transpose([int(p) for p in iota[4].split(",")])
        return ids.reshape(groups, size).tolist()
    explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attrs)
    if explicit and explicit[1]:
        return [[int(i) for i in grp.split(",") if i] for grp in re.findall(r"\{([\d,]*)\}",
                                                                             explicit[1])]
    return [list(range(num_chips))]


def _permute_targets(attrs: str) -> list[int]:
    pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs)
    return [int(t) for _, t in re.findall(r"\{(\d+),(\d+)\}", pairs[1])] if pairs else []


def _parse(hlo_text: str):
    """Instructions as (computation, name, shape, op, operand names, attrs); computations' calls."""
    instructions, calls = [], defaultdict(list)
    computation = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head and "=" not in line.split("(")[0]:
            computation = head["name"]
            continue
        m = _INSTRUCTION.match(line)
        if not m or computation is None:
            continue
        operands = re.findall(r"%([\w.\-]+)", m["operands"]) or [
            o.strip().split()[-1] for o in m["operands"].split(",") if o.strip()]
        instructions.append((computation, m["name"], m["shape"], m["op"], operands, m["attrs"]))
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', m["attrs"])
        for role, callees in _CALLEES.findall(m["attrs"]):
            known = role == "body" and trips is not None
            for callee in re.findall(r"[\w.\-]+", callees):
                calls[computation].append((callee, int(trips[1]) if known else 1,
                                           role == "body" and not known))
    return instructions, calls


def _multipliers(calls, entry: str):
    """Times each computation runs per program execution, and whether that is a guess."""
    times, unknown = {entry: 1}, {entry: False}
    stack = [entry]
    while stack:
        caller = stack.pop()
        for callee, n, guessed in calls.get(caller, ()):
            if callee not in times:
                times[callee] = times[caller] * n
                unknown[callee] = unknown[caller] or guessed
                stack.append(callee)
    return times, unknown


def received_bytes_per_chip(compiled_or_hlo_text, num_chips: int) -> dict:
    """Bytes each chip receives in the collectives of one execution of the program.

    Args:
        compiled_or_hlo_text: a jax `Compiled` (its as_text() is read) or HLO text.
        num_chips: chips of the SPMD program (device ids 0 … num_chips−1).
    Chips are numbered as XLA numbers partitions (the mesh's device order), which is not the
    CP position order when a tuple of axes is given out of the mesh's order.
    Returns: {"max_bytes": int (the most any chip receives), "per_chip": [int] * num_chips,
        "ops": [{"name", "op", "operand_bytes", "groups", "times", "trip_count_unknown",
        "per_chip": [int]}]} — one entry per collective instruction.
    """
    text = compiled_or_hlo_text if isinstance(compiled_or_hlo_text, str) else (
        compiled_or_hlo_text.as_text())
    instructions, calls = _parse(text)
    sizes = {name: shape_bytes(shape) for _, name, shape, _, _, _ in instructions}
    entry = re.search(r"^\s*ENTRY\s+%?([\w.\-]+)", text, re.M)
    times, unknown = _multipliers(calls, entry[1] if entry else instructions[0][0])
    total = np.zeros(num_chips, dtype=np.int64)
    ops = []
    for computation, name, shape, op, operands, attrs in instructions:
        kind = op[:-len("-start")] if op.endswith("-start") else op
        if kind not in COLLECTIVES:
            continue
        S = sum(sizes.get(o, 0) for o in operands)
        received = np.zeros(num_chips, dtype=np.float64)
        groups = [] if kind == "collective-permute" else _replica_groups(attrs, num_chips)
        if kind == "collective-permute":
            for target in _permute_targets(attrs):
                received[target] += S
        for group in groups:
            G = len(group)
            share = {"all-gather": (G - 1) * S, "all-to-all": (G - 1) / G * S,
                     "reduce-scatter": (G - 1) / G * S, "all-reduce": 2 * (G - 1) / G * S,
                     "collective-broadcast": S}[kind]
            for position, chip in enumerate(group):
                if kind != "collective-broadcast" or position > 0:
                    received[chip] += share
        n = times.get(computation, 1)
        per_chip = np.rint(received * n).astype(np.int64)
        total += per_chip
        ops.append({"name": name, "op": kind, "operand_bytes": S, "groups": groups,
                    "times": n, "trip_count_unknown": unknown.get(computation, False),
                    "per_chip": per_chip.tolist()})
    return {"max_bytes": int(total.max(initial=0)), "per_chip": total.tolist(), "ops": ops}
