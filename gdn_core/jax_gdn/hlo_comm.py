"""Bytes each chip receives in collectives, read from a compiled XLA program's HLO text.

Per collective instruction, with G the size of the chip's replica group and S the bytes of the
instruction's operands (their printed shapes, else their definitions in the same computation,
so sync ops, async `-start` ops — whose results are tuples of buffers — and combined
tuple-shaped ops are all sized the same way):

    all-gather          (G−1)·S           every other member's shard
    all-to-all          (G−1)/G·S         all but the block the chip keeps
    reduce-scatter      (G−1)/G·S         ring: G−1 steps of S/G
    all-reduce          2·(G−1)/G·S       ring convention: reduce-scatter then all-gather
    collective-permute  S                 for each chip that is a target in source_target_pairs
    collective-broadcast S                for each group member other than the first
    recv                S (its buffer)    for each target in _xla_send_recv_source_target_pairs
                                          (a collective-permute XLA:GPU split into send/recv)

G is the chip's own group: on a mesh of several axes, a collective over some of them has one
replica group per combination of the others (a dp × CP mesh's CP collectives: one group per
replica, contiguous or strided ids by the axes' order), and each chip counts its own group's.
Async forms are counted once: `-start` ops (all-gather-start, reduce-scatter-start, …) carry
the collective, `-update` / `-done` halves are skipped, and a generic `async-start(...),
calls=%wrapped` counts the collective inside its wrapped computation. A computation runs as
often as its call sites do, summed (a while body once per trip when XLA recorded
known_trip_count, else once, flagged). Reads what XLA prints for CPU, GPU and TPU: operands
with or without shapes, TPU tiled layouts ({1,0:T(8,128)(2,1)S(1)}), instructions wrapped over
several lines, names reused across computations.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import numpy as np

DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1, "bf16": 2,
               "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8,
               "u64": 8, "c64": 8, "c128": 16, "token": 0}
COLLECTIVES = ("all-gather", "all-to-all", "reduce-scatter", "all-reduce", "collective-permute",
               "collective-broadcast")

_NAME = re.compile(r"^(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(?:\(.*\)\s*->.*)?\{$")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-]*)\(")
_CALLEES = re.compile(r"\b(body|condition|to_apply|calls|branch_computations|true_computation|"
                      r"false_computation)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,\s<=]*)\]")
_ARRAY_SHAPE = re.compile(r"[a-z]\w*\[[^\]]*\](?:\{[^}]*\})?")
_PAIR = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")
_CLOSE = {"(": ")", "{": "}", "[": "]"}
_INLINE_COMMENT = re.compile(r"/\*.*?\*/")


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO shape, summing every array of a tuple (layouts and comments ignored;
    a bounded dynamic dimension <=N counts as N)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        if dtype in DTYPE_BYTES:
            sizes = [int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip()]
            total += DTYPE_BYTES[dtype] * math.prod(sizes)
    return total


def _scan(text: str, start: int = 0) -> int:
    """Index just past the bracket group opened at text[start], skipping quoted strings;
    -1 if it never closes."""
    expected, quoted, escaped = [], False, False
    for i in range(start, len(text)):
        c = text[i]
        if quoted:
            quoted = escaped or c != '"'
            escaped = not escaped and c == "\\"
        elif c == '"':
            quoted = True
        elif c in _CLOSE:
            expected.append(_CLOSE[c])
        elif expected and c == expected[-1]:
            expected.pop()
            if not expected:
                return i + 1
    return -1


def _open_brackets(line: str) -> bool:
    """Whether brackets outside quoted strings are left open (the instruction goes on)."""
    bare = _QUOTED.sub("", line)
    return any(bare.count(o) > bare.count(c) for o, c in _CLOSE.items())


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(text):
        if quoted:
            quoted = c != '"' or text[i - 1] == "\\"
        elif c == '"':
            quoted = True
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _instruction(line: str):
    """(name, shape, op, the rest: operand list and attributes) of one instruction."""
    head = _NAME.match(line)
    rest = line[head.end():]
    if rest.startswith("("):  # a tuple shape
        end = _scan(rest, 0)
    else:
        array = _ARRAY_SHAPE.match(rest)
        end = array.end() if array else -1
    op = _OPCODE.match(rest, end) if end > 0 else None
    if not op:
        return None
    return head["name"], rest[:end], op["op"], rest[op.end() - 1:]


def _operands(rest: str) -> list[tuple[str, str | None]]:
    """(name, printed shape or None) of each operand in `rest` = "(operands), attributes"."""
    close = _scan(rest, 0)
    operands = []
    for text in _split_top_level(rest[1:close - 1] if close > 0 else ""):
        ref = re.search(r"%?([\w.\-]+)$", text)
        if ref:
            operands.append((ref[1], text[:ref.start()].strip() or None))
    return operands


def _logical_lines(hlo_text: str):
    """Lines of the text with instructions that XLA's test files wrap over several lines
    joined (while brackets are open or a line ends with a comma), and the /*index=5*/ comments
    XLA puts in long operand and tuple lists removed (else one reads as an operand's shape)."""
    pending = ""
    for raw in hlo_text.splitlines():
        line = _INLINE_COMMENT.sub("", raw).strip()
        if not line or line.startswith("//"):
            continue
        if pending or _NAME.match(line):
            pending = f"{pending} {line}".strip()
            if _open_brackets(pending) or pending.endswith(","):
                continue
            yield pending
            pending = ""
        else:
            yield line
    if pending:
        yield pending


_OP_NAME = re.compile(r'op_name="([^"]*)"')
"""The JAX source path of an instruction (its metadata), named scopes included."""


def _parse(hlo_text: str):
    """Instructions as (computation, name, shape, op, operands and attributes); each
    computation's call sites as (callee, times per call, trip count unknown)."""
    instructions, calls, computation = [], defaultdict(list), None
    for line in _logical_lines(hlo_text):
        if not _NAME.match(line):
            head = _COMPUTATION.match(line)
            if head and not line.startswith("HloModule"):
                computation = head["name"]
            continue
        parsed = _instruction(line) if computation is not None else None
        if parsed is None:
            continue
        name, shape, op, attrs = parsed
        instructions.append((computation, name, shape, op, attrs))
        if op.endswith(("-done", "-update")):  # the async chain runs its computation once
            continue
        trips = _TRIP_COUNT.search(attrs)
        for role, callees in _CALLEES.findall(_QUOTED.sub('""', attrs)):
            known = role == "body" and trips is not None
            for callee in re.findall(r"[\w.\-]+", callees):
                calls[computation].append((callee, int(trips[1]) if known else 1,
                                           role == "body" and not known))
    return instructions, calls


def _multipliers(calls, entry: str):
    """Times each computation runs per program execution (summed over its call sites), and
    whether a while loop of unknown trip count is on the way."""
    order, seen = [], set()

    def visit(computation):
        seen.add(computation)
        for callee, _, _ in calls.get(computation, ()):
            if callee not in seen:
                visit(callee)
        order.append(computation)

    visit(entry)
    times, unknown = defaultdict(int, {entry: 1}), defaultdict(bool)
    for caller in reversed(order):  # callers before callees (the call graph is a DAG)
        for callee, n, guessed in calls.get(caller, ()):
            times[callee] += times[caller] * n
            unknown[callee] |= unknown[caller] or guessed
    return times, unknown


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
    explicit = re.search(r"replica_groups=\{", attrs)
    if explicit:
        text = attrs[explicit.end() - 1:_scan(attrs, explicit.end() - 1)]
        groups = [[int(i) for i in g.split(",") if i.strip()]
                  for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
        if groups:
            return groups
    return [list(range(num_chips))]


def _targets(attrs: str, key: str) -> list[int]:
    """Target chips of `key`={{source,target},...} (optionally quoted, as recv's is)."""
    pairs = re.search(key + r'="?\{((?:\s*\{\s*\d+\s*,\s*\d+\s*\}\s*,?)*)\}', attrs)
    return [int(t) for _, t in _PAIR.findall(pairs[1])] if pairs else []


def _collective(op: str, attrs: str) -> str | None:
    """The collective an instruction performs (None for everything else)."""
    kind = op[:-len("-start")] if op.endswith("-start") else op
    if kind in COLLECTIVES:
        return kind
    if (op == "recv" and "_xla_send_recv_source_target_pairs" in attrs
            and "is_host_transfer=true" not in attrs):
        return "recv"
    return None


def _received(kind: str, S: int, attrs: str, num_chips: int):
    """Bytes each chip receives from one execution of the collective, and its groups."""
    received = np.zeros(num_chips, dtype=np.float64)
    if kind in ("collective-permute", "recv"):
        key = ("source_target_pairs" if kind == "collective-permute"
               else "_xla_send_recv_source_target_pairs")
        for target in _targets(attrs, key):
            received[target] += S
        return received, []
    groups = _replica_groups(attrs, num_chips)
    for group in groups:
        G = len(group)
        share = {"all-gather": (G - 1) * S, "all-to-all": (G - 1) / G * S,
                 "reduce-scatter": (G - 1) / G * S, "all-reduce": 2 * (G - 1) / G * S,
                 "collective-broadcast": S}[kind]
        for position, chip in enumerate(group):
            if kind != "collective-broadcast" or position > 0:
                received[chip] += share
    return received, groups


def received_bytes_per_chip(compiled_or_hlo_text, num_chips: int) -> dict:
    """Bytes each chip receives in the collectives of one execution of the program.

    Args:
        compiled_or_hlo_text: a jax `Compiled` (its as_text() is read) or HLO text.
        num_chips: chips of the SPMD program (device ids 0 … num_chips−1).
    Chips are numbered as XLA numbers partitions (the mesh's device order), which is not the
    CP position order when a tuple of axes is given out of the mesh's order.
    Returns: {"max_bytes": int (the most any chip receives), "per_chip": [int] * num_chips,
        "ops": [{"name", "op", "operand_bytes", "groups", "times", "trip_count_unknown",
        "per_chip": [int], "op_name": the JAX source path (named scopes included), "operands":
        [{"bytes", "per_chip": as if that operand were sent alone}]}]} — one entry per
        collective instruction (a combined one lists each operand it carries).
    Raises ValueError when a collective's operand has no printed shape and no definition in
    its computation (the bytes would be a guess).
    """
    text = compiled_or_hlo_text if isinstance(compiled_or_hlo_text, str) else (
        compiled_or_hlo_text.as_text())
    instructions, calls = _parse(text)
    if not instructions:
        return {"max_bytes": 0, "per_chip": [0] * num_chips, "ops": []}
    sizes = {(comp, name): shape_bytes(shape) for comp, name, shape, *_ in instructions}
    entry = re.search(r"^\s*ENTRY\s+%?([\w.\-]+)", text, re.M)
    times, unknown = _multipliers(calls, entry[1] if entry else instructions[0][0])
    total = np.zeros(num_chips, dtype=np.int64)
    ops = []
    for computation, name, shape, op, attrs in instructions:
        kind = _collective(op, attrs)
        if kind is None:
            continue
        if kind == "recv":  # its operand is a token; the buffer is its result's first array
            operand_bytes = [shape_bytes(_ARRAY.search(shape)[0])]
        else:
            operand_bytes = []
            for operand, printed in _operands(attrs):
                if printed is None and (computation, operand) not in sizes:
                    raise ValueError(f"operand %{operand} of {op} %{name} (computation "
                                     f"{computation}) has no shape in the HLO text")
                operand_bytes.append(shape_bytes(printed) if printed
                                     else sizes[(computation, operand)])
        S = sum(operand_bytes)
        received, groups = _received(kind, S, attrs, num_chips)
        n = times.get(computation, 1)
        per_chip = np.rint(received * n).astype(np.int64)
        total += per_chip
        op_name = _OP_NAME.search(attrs)
        # Each operand as if sent alone (what a combined collective's parts would cost).
        alone = [np.rint(_received(kind, b, attrs, num_chips)[0] * n).astype(np.int64).tolist()
                 for b in operand_bytes] if len(operand_bytes) > 1 else [per_chip.tolist()]
        ops.append({"name": name, "op": kind, "operand_bytes": S, "groups": groups,
                    "times": n, "trip_count_unknown": unknown.get(computation, False),
                    "per_chip": per_chip.tolist(), "op_name": op_name[1] if op_name else "",
                    "operands": [{"bytes": b, "per_chip": c}
                                 for b, c in zip(operand_bytes, alone)]})
    return {"max_bytes": int(total.max(initial=0)), "per_chip": total.tolist(), "ops": ops}
