"""gdn_core and workers run on every torch from 2.9 on: no torch.distributed name newer than
torch 2.9 (read from the source; the installed torch may have them)."""

from __future__ import annotations

import re
from pathlib import Path

import torch.distributed as dist

import gdn_core

REPO = Path(gdn_core.__file__).parent.parent
SCANNED = ("gdn_core", "workers")

NEWER_THAN_TORCH_2_9 = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}
"""torch.distributed names torch 2.9 lacks (torch 2.13 deprecates the right-hand names in
their favour), each with the name to use instead, present in 2.9 … 2.13."""

_USE = re.compile(r"\.(" + "|".join(NEWER_THAN_TORCH_2_9) + r")\b")


def newer_names(path: Path) -> list[str]:
    """`line N: text` for every attribute use of a name in NEWER_THAN_TORCH_2_9."""
    return [f"line {n}: {line.strip()}" for n, line in
            enumerate(path.read_text().splitlines(), start=1) if _USE.search(line)]


def test_the_replacements_exist_in_this_torch():
    assert all(hasattr(dist, name) for name in NEWER_THAN_TORCH_2_9.values())


def test_the_scan_sees_a_use():
    assert _USE.search("        dist.all_gather_single(out, x, group=group)")
    assert not _USE.search("dist.all_gather_into_tensor(out, x)  # not *_single")


def test_no_torch_distributed_name_newer_than_2_9():
    found = {}
    for package in SCANNED:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if hits := newer_names(path):
                found[rel] = hits
    assert not found, "names torch 2.9 lacks (use " + ", ".join(
        f"{new} for {old}" for old, new in NEWER_THAN_TORCH_2_9.items()) + "):\n" + "\n".join(
        f"{rel} {hit}" for rel, hits in found.items() for hit in hits)
