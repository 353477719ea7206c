"""Bytes the PyTorch CP rule saves for backward, against the single-chip rule on the same shard.

The sequence-sharded modes fold a shard's chunks into one pair; autograd of that fold would
keep a running [A | b] per chunk. The fold's backward is written out (cp/common.py), so what a
rank saves grows with its chunks no faster than what the single-chip rule saves for the same
local shard. Counted with torch.autograd.graph.saved_tensors_hooks, each storage once (the
exchange's own pair-sized graph is kept under inner hooks of its own, so it is not counted).
Legend: D ranks, t tokens per rank, N chunks per rank, H heads, K/V head dims.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from gdn_core.torch_gdn import chunk_gated_delta_rule
from gdn_core.torch_gdn.cp import chunk_gated_delta_rule_cp

from .torch_dist import run_in_process_group

MODES = ("p2p", "all_gather", "log_scan")
D, B, H, DK, DV, CHUNK = 2, 1, 2, 16, 16, 16
T_LOCALS = (64, 128)  # N = 4 and 8 chunks per rank
PAIR_BYTES = B * H * DK * (DK + DV) * 4


def saved_bytes(fn) -> tuple[int, object]:
    """(bytes of the distinct storages autograd saves while fn runs, fn's result).

    The storages are held until the count is done, so that a freed one's address cannot be
    reused by a later one (which would make the count depend on the allocator).
    """
    storages: dict[int, torch.UntypedStorage] = {}

    def pack(x):
        storage = x.untyped_storage()
        storages[storage.data_ptr()] = storage
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn()
    return sum(s.nbytes() for s in storages.values()), out


def shard_inputs(rank: int, t: int, cosine: float = 0.9) -> list[torch.Tensor]:
    """q, k, v, g, beta of this rank's shard; keys of a head share a direction (cosine 0.9)."""
    rng = np.random.default_rng(rank)
    u = rng.standard_normal((1, 1, H, DK))
    n = rng.standard_normal((B, t, H, DK))
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    k = unit(cosine * unit(u) + np.sqrt(1 - cosine ** 2) * unit(n))
    arrays = (rng.standard_normal((B, t, H, DK)), k, rng.standard_normal((B, t, H, DV)),
              np.log(rng.uniform(0.95, 1.0, (B, t, H))), rng.uniform(0.5, 1.0, (B, t, H)))
    return [torch.tensor(a, dtype=torch.float32).requires_grad_() for a in arrays]


def memory_job(rank: int, world_size: int) -> dict:
    """Saved bytes per (mode, t) on this rank, plus the single-chip rule's on the same shard."""
    out = {}
    for t in T_LOCALS:
        xs = shard_inputs(rank, t)
        out[("single", t)], _ = saved_bytes(
            lambda: chunk_gated_delta_rule(*xs, use_qk_l2norm=True, chunk_size=CHUNK))
        for mode in MODES:
            out[(mode, t)], (o, final) = saved_bytes(lambda: chunk_gated_delta_rule_cp(
                *xs, group=None, mode=mode, output_final_state=True, use_qk_l2norm=True,
                chunk_size=CHUNK))
            (o.sum() + final.sum()).backward()  # the saved graph is usable (every rank joins)
    return out


@functools.cache
def memory_results() -> list[dict]:
    return run_in_process_group(memory_job, world_size=D, timeout_s=120)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", MODES)
def test_saved_bytes_grow_no_faster_than_single_chip(mode):
    short, long = T_LOCALS
    chunks_added = (long - short) // CHUNK
    for rank, saved in enumerate(memory_results()):
        single_growth = saved[("single", long)] - saved[("single", short)]
        cp_growth = saved[(mode, long)] - saved[(mode, short)]
        # A running pair per chunk (autograd of the fold) would add chunks_added · PAIR_BYTES.
        assert single_growth > chunks_added * PAIR_BYTES  # the comparison has room to fail
        assert cp_growth <= single_growth, (rank, cp_growth, single_growth)
        # Beyond the single chip's terms: the exchange's pairs, a constant in the chunks.
        assert saved[(mode, long)] <= saved[("single", long)] + 2 * D * PAIR_BYTES, rank
