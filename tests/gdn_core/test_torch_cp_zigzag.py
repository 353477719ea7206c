"""Every PyTorch GDN CP mode under both sequence layouts (contiguous, zigzag), on real gloo
process groups (spawned ranks).

Under zigzag rank r holds segments r and 2D−1−r of 2D (gdn_core.cp_layout). Oracles: the
single-chip rule on the full sequence and the token-by-token recurrence (rule); the
single-chip GatedDeltaNet (layer). One spawned job per D runs every case on every rank and
returns numpy arrays; the tests below only compare. Legend: D ranks, t tokens per rank,
s = t/2 tokens per zigzag segment, B batch, Hk/Hv key/value heads.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch

from gdn_core.config import GDNConfig
from gdn_core.cp_layout import LAYOUTS, local_positions
from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn import (
    GatedDeltaNet,
    chunk_gated_delta_rule,
    context_parallel,
    recurrent_gated_delta_rule,
)
from gdn_core.torch_gdn.cp import chunk_gated_delta_rule_cp, count_comm

from .rule_inputs import RuleCase, make_inputs
from .torch_dist import run_in_process_group

MODES = CP_MODES
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
# D = 2 in the default tier; D = 4 and 8 in the slow tier (test_torch_cp.py keeps D = 4 at the
# rule level: p2p's multi-hop wavefront and log_scan's second round).
DS = [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
# t = 24: segments of 12 tokens, shorter than the 16-token chunk; t = 40: 20, not a multiple.
CHUNK, T_LOCAL, T_LONG, B, DK, DV = 16, 24, 40, 2, 16, 24
TOL = 1e-4


@dataclasses.dataclass(frozen=True)
class RuleCPCase:
    mode: str
    layout: str
    D: int
    t: int = T_LOCAL
    final: bool = True

    @property
    def heads(self) -> tuple[int, int]:
        """GQA (2, 4); ulysses with fewer key heads than ranks where D > 2 (copies)."""
        return {2: (1, 4), 4: (2, 4), 8: (2, 8)}[self.D] if self.mode == "ulysses" else (2, 4)

    @property
    def rule(self) -> RuleCase:
        # Realistic keys: a shared direction per head (cosine 0.9), β ∈ U(0.5, 1).
        return RuleCase(B, self.D * self.t, *self.heads, DK, DV, "weak", CHUNK)

    @property
    def id(self) -> str:
        return f"{self.mode}-{self.layout}-D{self.D}-t{self.t}-final{int(self.final)}"


def rule_cases(D: int) -> list[RuleCPCase]:
    return [c for m in MODES for lay in LAYOUTS
            for c in (RuleCPCase(m, lay, D), RuleCPCase(m, lay, D, t=T_LONG, final=False))]


def global_inputs(case: RuleCPCase) -> dict[str, np.ndarray]:
    """Global inputs and loss weights W_o [B, T, Hv, Dv], W_f [B, Hv, Dk, Dv] (float32); weak
    decay so that the state carries across every segment, one near-reset on one head."""
    x = make_inputs(case.rule, seed=case.D)
    x["g"][0, [5, case.rule.T // 2 + 3], 1] = -20.0
    rng = np.random.default_rng(100 + case.D)
    x["W_o"] = rng.standard_normal(x["v"].shape).astype(np.float32)
    x["W_f"] = rng.standard_normal(x["initial_state"].shape).astype(np.float32)
    return x


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def positions(rank: int, D: int, T: int, layout: str) -> np.ndarray:
    return local_positions(chip=rank, chips=D, seq_len=T, layout=layout)


def run_rule(rank: int, D: int, case: RuleCPCase, group) -> dict:
    """One rank: its o shard (local order), the final state, input grads, counted bytes."""
    x = global_inputs(case)
    pos = positions(rank, D, case.rule.T, case.layout)
    xs = {n: torch.tensor(x[n] if n == "initial_state" else x[n][:, pos]).requires_grad_()
          for n in NAMES}
    with count_comm() as comm:
        o, final = chunk_gated_delta_rule_cp(
            *(xs[n] for n in NAMES[:5]), group=group, mode=case.mode, layout=case.layout,
            initial_state=xs["initial_state"], output_final_state=case.final,
            use_qk_l2norm=True, chunk_size=CHUNK)
        loss = (o * torch.tensor(x["W_o"][:, pos])).sum()
        if final is not None:  # the same term on every rank, weighted 1/D: losses sum to one chip's
            loss = loss + (final * torch.tensor(x["W_f"])).sum() / D
        loss.backward()
    out = {n: np32(torch.zeros_like(xs[n]) if xs[n].grad is None else xs[n].grad) for n in NAMES}
    out.update(o=np32(o), final=None if final is None else np32(final),
               forward=comm.forward_bytes, backward=comm.backward_bytes)
    return out


# --- the layer -------------------------------------------------------------------------------

def gdn_cfg(D: int) -> GDNConfig:
    """Hk = 4, Hv = 8 (GQA) for D ≤ 4, Hk = D, Hv = 2D above (ulysses divides them)."""
    Hk = max(4, D)
    return GDNConfig(hidden_size=32, num_k_heads=Hk, num_v_heads=2 * Hk, head_k_dim=8,
                     head_v_dim=8, conv_kernel_size=4, chunk_size=16)


def make_layer(cfg: GDNConfig) -> GatedDeltaNet:
    """Seeded weights, slow decay (A ≤ 0.1) so that state crosses every segment."""
    layer = GatedDeltaNet(cfg)
    gen = torch.Generator().manual_seed(0)
    layer.reset_parameters(gen)
    with torch.no_grad():
        layer.A_log.copy_(torch.empty(cfg.num_v_heads).uniform_(0.005, 0.1, generator=gen).log())
        layer.dt_bias.copy_(torch.randn(cfg.num_v_heads, generator=gen))
    return layer


def layer_data(D: int) -> tuple[np.ndarray, np.ndarray]:
    """Input x and loss weights W, both [B, D·t, hidden] float32."""
    rng = np.random.default_rng(D)
    shape = (B, D * T_LOCAL, gdn_cfg(D).hidden_size)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


def run_layer(rank: int, D: int, mode: str, layout: str, remat: bool, group) -> dict:
    """One rank: the CP layer's output shard, input and parameter grads, counted bytes; with
    `remat` the core (exchanges included) is recomputed in backward (remat 'gdn')."""
    x, W = layer_data(D)
    pos = positions(rank, D, D * T_LOCAL, layout)
    cp = context_parallel(make_layer(gdn_cfg(D)), group=group,
                          cp=CPSettings(mode=mode, chips=D, layout=layout))
    cp.recompute_core = remat
    x_local = torch.tensor(x[:, pos]).requires_grad_()
    with count_comm() as comm:
        y = cp(x_local)
        (y * torch.tensor(W[:, pos])).sum().backward()
    return {"y": np32(y), "dx": np32(x_local.grad),
            "grads": {n: np32(p.grad) for n, p in cp.named_parameters()},
            "forward": comm.forward_bytes, "backward": comm.backward_bytes}


LAYER_CASES = [("contiguous", False), ("zigzag", False), ("zigzag", True)]


def layer_id(mode: str, layout: str, remat: bool) -> str:
    return f"layer-{mode}-{layout}" + ("-remat" if remat else "")


# --- errors ----------------------------------------------------------------------------------

def rule_error(t: int, layout: str, group) -> str:
    q = torch.zeros(1, t, 2, 8)
    try:
        chunk_gated_delta_rule_cp(q, q, torch.zeros(1, t, 4, 8), torch.zeros(1, t, 4),
                                  torch.zeros(1, t, 4), group=group, mode="p2p", layout=layout)
    except ValueError as e:
        return str(e)
    return "no error"


def layer_error(D: int, t: int, group) -> str:
    cp = context_parallel(GatedDeltaNet(gdn_cfg(D)), group=group,
                          cp=CPSettings(mode="p2p", chips=D, layout="zigzag"))
    try:
        cp(torch.zeros(1, t, gdn_cfg(D).hidden_size))
    except ValueError as e:
        return str(e)
    return "no error"


def cases_job(rank: int, D: int, group) -> dict:
    """Everything one rank (`rank` in `group`, of D) computes."""
    out = {case.id: run_rule(rank, D, case, group) for case in rule_cases(D)}
    out.update({layer_id(m, lay, remat): run_layer(rank, D, m, lay, remat, group)
                for m in MODES for lay, remat in LAYER_CASES})
    out["odd_shard"] = rule_error(5, "zigzag", group)
    out["bad_layout"] = rule_error(4, "striped", group)
    out["short_segment"] = layer_error(D, 4, group)  # segments of 2 tokens, halo of 3
    return out


def zigzag_job(rank: int, world: int) -> dict:
    """Every case for D = world, then for D = world/2 on ranks 0 … D−1 (spawning costs far more
    than the cases on this host, so one spawn serves two D). Not on the upper half: there
    torch's gloo all_to_all backward (under comm.all_to_all_single) scatters from the group
    rank as if it were global, and fails on a group whose ranks are not the global ones."""
    out = {world: cases_job(rank, world, None)}
    if world == 4:
        D = world // 2
        half = torch.distributed.new_group(list(range(D)))  # every rank joins its creation
        if rank < D:
            out[D] = cases_job(rank, D, half)
    return out


@functools.cache
def spawned(world: int) -> list[dict]:
    return run_in_process_group(zigzag_job, world_size=world, timeout_s=120 + 30 * world)


def results(D: int) -> list[dict]:
    """Every rank's results for D ranks (D = 2 from the 4-rank spawn)."""
    if D == 2:
        return [r[2] for r in spawned(4)[:2]]
    return [r[D] for r in spawned(D)]


def gathered(ranks: list[dict], names, D: int, T: int, layout: str) -> dict:
    """Per-rank shards (local order) put back at their global positions."""
    out = {}
    for n in names:
        first = ranks[0][n]
        full = np.zeros(first.shape[:1] + (T,) + first.shape[2:], first.dtype)
        for rank, r in enumerate(ranks):
            full[:, positions(rank, D, T, layout)] = r[n]
        out[n] = full
    return out


@functools.cache
def rule_reference(case: RuleCPCase) -> dict:
    """The single-chip rule on the full sequence with the same loss, and the recurrence."""
    x = global_inputs(case)
    xs = {n: torch.tensor(x[n]).requires_grad_() for n in NAMES}
    o, final = chunk_gated_delta_rule(*(xs[n] for n in NAMES[:5]),
                                      initial_state=xs["initial_state"], output_final_state=True,
                                      use_qk_l2norm=True, chunk_size=CHUNK)
    loss = (o * torch.tensor(x["W_o"])).sum()
    (loss + (final * torch.tensor(x["W_f"])).sum() if case.final else loss).backward()
    o_rec, final_rec = recurrent_gated_delta_rule(
        *(xs[n].detach() for n in NAMES[:5]), initial_state=xs["initial_state"].detach(),
        output_final_state=True, use_qk_l2norm=True)
    # The last segment alone (no state from before it): the test is only meaningful if the
    # state crossing segments changes it.
    s = case.t // 2 if case.layout == "zigzag" else case.t
    o_alone, _ = chunk_gated_delta_rule(*(xs[n].detach()[:, -s:] for n in NAMES[:5]),
                                        initial_state=xs["initial_state"].detach(),
                                        use_qk_l2norm=True, chunk_size=CHUNK)
    return dict({n: np32(xs[n].grad) for n in NAMES}, o=np32(o), final=np32(final),
                o_recurrent=np32(o_rec), final_recurrent=np32(final_rec), o_last=s,
                o_last_alone=np32(o_alone))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_rule_matches_single_chip_and_recurrence(mode, layout, D):
    """o, the final state and every input gradient equal the one-chip rule's (and o, the final
    state the token-by-token recurrence's), fp32, correlated keys."""
    ranks = results(D)
    for case in (RuleCPCase(mode, layout, D), RuleCPCase(mode, layout, D, T_LONG, final=False)):
        ref, got_ranks = rule_reference(case), [r[case.id] for r in ranks]
        T = case.rule.T
        assert rel_err(ref["o"][:, -ref["o_last"]:], ref["o_last_alone"]) > 100 * TOL
        got = gathered(got_ranks, ("o",) + NAMES[:5], D, T, layout)
        got["initial_state"] = np.sum([r["initial_state"] for r in got_ranks], axis=0)
        for name in ("o",) + NAMES:
            assert_close(f"{case.id}: {name}", ref[name], got[name], TOL)
        assert_close(f"{case.id}: o vs recurrence", ref["o_recurrent"], got["o"], TOL)
        if case.final:
            assert all(np.array_equal(r["final"], got_ranks[0]["final"]) for r in got_ranks)
            assert_close(f"{case.id}: final", ref["final"], got_ranks[0]["final"], TOL)
            assert_close(f"{case.id}: final vs recurrence", ref["final_recurrent"],
                         got_ranks[0]["final"], TOL)
        else:
            assert all(r["final"] is None for r in got_ranks)


def zigzag_rule_bytes(case: RuleCPCase, rank: int) -> tuple[int, int]:
    """(forward, backward) bytes `rank` receives in the rule under zigzag, from the table.

    p2p: a state from each neighbour (down the first segments, back up the second ones);
    all_gather: both pairs of every other rank; log_scan: a scan up the first segments and one
    down the second ones (a pair in each round where a peer exists); ulysses: as contiguous.
    The final state (if asked) is broadcast from rank 0 (its backward: a reduce onto rank 0).
    """
    D, (Hk, Hv), t = case.D, case.heads, case.t
    state, pair = B * Hv * DK * DV * 4, B * Hv * DK * (DK + DV) * 4
    rounds = [2 ** i for i in range(math.ceil(math.log2(D)))]
    neighbours = (rank > 0) + (rank < D - 1)
    if case.mode == "p2p":
        fwd = bwd = state * neighbours
    elif case.mode == "all_gather":
        fwd = bwd = 2 * (D - 1) * pair
    elif case.mode == "log_scan":
        received = sum(d <= rank for d in rounds) + sum(rank + d < D for d in rounds)
        assert received <= 2 * math.ceil(math.log2(D))
        fwd = bwd = received * pair
    else:
        G = Hk // D if Hk % D == 0 else 1 if D % Hk == 0 else Hv // D
        fwd = bwd = (D - 1) * B * t * (2 * G * DK + (Hv // D) * (2 * DV + 2)) * 4
    if case.final and case.mode == "ulysses":
        fwd, bwd = fwd + (D - 1) * state // D, bwd + (D - 1) * state // D
    elif case.final and case.mode != "all_gather":
        fwd, bwd = fwd + state * (rank != 0), bwd + (D - 1) * state * (rank == 0)
    return fwd, bwd


@pytest.mark.timeout(400)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_zigzag_rule_bytes_match_table(mode, D):
    """Bytes each rank receives under zigzag = the table's figure, flat in the shard length for
    the summary modes (no re-shard: nothing of sequence length crosses)."""
    ranks = results(D)
    for case in (RuleCPCase(mode, "zigzag", D), RuleCPCase(mode, "zigzag", D, T_LONG, False)):
        for rank, r in enumerate(ranks):
            assert (r[case.id]["forward"], r[case.id]["backward"]) == \
                zigzag_rule_bytes(case, rank), (case.id, rank)


def zigzag_layer_bytes(mode: str, D: int, rank: int) -> tuple[int, int]:
    """(forward, backward) bytes one zigzag CP layer receives on `rank` (no final state):
    the rule's exchange plus, for the sequence-sharded modes, a conv halo B·(K−1)·C from each
    neighbour (before segment r from rank r−1, before segment 2D−1−r from rank r+1)."""
    cfg = gdn_cfg(D)
    Hk, Hv, Dk, Dv, C = (cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim,
                         cfg.conv_dim)
    if mode == "ulysses":  # pre-conv q, k, v, a, b in, o back; D divides Hk here
        G = Hk // D
        each = (D - 1) * B * T_LOCAL * (2 * G * Dk + (Hv // D) * (2 * Dv + 2)) * 4
        return each, each
    neighbours = (rank > 0) + (rank < D - 1)
    halo = B * (cfg.conv_kernel_size - 1) * C * 4 * neighbours
    state, pair = B * Hv * Dk * Dv * 4, B * Hv * Dk * (Dk + Dv) * 4
    if mode == "p2p":
        rule = state * neighbours
    elif mode == "all_gather":
        rule = 2 * (D - 1) * pair
    else:
        rounds = [2 ** i for i in range(math.ceil(math.log2(D)))]
        rule = pair * (sum(d <= rank for d in rounds) + sum(rank + d < D for d in rounds))
    return halo + rule, halo + rule


@functools.cache
def layer_reference(D: int) -> dict:
    x, W = layer_data(D)
    layer = make_layer(gdn_cfg(D))
    x_full = torch.tensor(x).requires_grad_()
    y = layer(x_full)
    (y * torch.tensor(W)).sum().backward()
    return {"y": np32(y), "dx": np32(x_full.grad),
            "grads": {n: np32(p.grad) for n, p in layer.named_parameters()}}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize(("layout", "remat"), LAYER_CASES,
                         ids=[layer_id("", lay, remat)[7:] for lay, remat in LAYER_CASES])
@pytest.mark.parametrize("mode", MODES)
def test_layer_matches_single_chip(mode, layout, remat, D):
    """The CP layer's output and input gradient (put back at their positions) and its
    rank-summed parameter gradients equal the single-chip layer's, also with the core
    recomputed in backward; bytes = the table (a recomputation repeats the forward's)."""
    ranks, ref = [r[layer_id(mode, layout, remat)] for r in results(D)], layer_reference(D)
    case = f"{layer_id(mode, layout, remat)}-D{D}"
    got = gathered(ranks, ("y", "dx"), D, D * T_LOCAL, layout)
    assert_close(f"{case}: y", ref["y"], got["y"], TOL)
    assert_close(f"{case}: dx", ref["dx"], got["dx"], TOL)
    assert all(list(r["grads"]) == list(ref["grads"]) for r in ranks)
    for name, grad in ref["grads"].items():
        assert_close(f"{case}: d{name}", grad, sum(r["grads"][name] for r in ranks), TOL)
    if layout == "zigzag":
        for rank, r in enumerate(ranks):
            fwd, bwd = zigzag_layer_bytes(mode, D, rank)
            assert (r["forward"], r["backward"]) == (fwd * (1 + remat), bwd), rank


@pytest.mark.timeout(400)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_bad_layout_and_shapes_name_the_numbers(D):
    r = results(D)[0]
    msg = r["odd_shard"]
    assert f"seq_len={5 * D} is not divisible by {2 * D}" in msg and "zigzag" in msg, msg
    assert "'striped'" in r["bad_layout"] and "contiguous, zigzag" in r["bad_layout"]
    msg = r["short_segment"]
    assert "zigzag segment of 2 tokens" in msg and "conv halo of 3 tokens" in msg, msg
