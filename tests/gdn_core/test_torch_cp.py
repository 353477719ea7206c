"""Context-parallel PyTorch rule, every mode, on real gloo process groups (spawned ranks).

The oracle is the single-chip `chunk_gated_delta_rule` on the full sequence (and the token-by-
token recurrence for the output). One spawned job per D runs every case on every rank and
returns numpy arrays; the tests below only compare. Legend: D ranks, t tokens per rank,
B batch, Hk/Hv key/value heads, Dk/Dv head dims.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch

from gdn_core.cp_modes import CP_MODES
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn import chunk_gated_delta_rule, recurrent_gated_delta_rule
from gdn_core.torch_gdn.cp import chunk_gated_delta_rule_cp, count_comm, exchange_conv_halo

from .rule_inputs import RuleCase, make_inputs
from .torch_dist import run_in_process_group

MODES = CP_MODES
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
DS = [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
CHUNK, T_LOCAL, B, DK, DV = 16, 24, 2, 16, 24  # t = 24: not a multiple of the chunk
HALO_T, HALO_C, HALO = 5, 6, 3
TOL = 1e-4
# bf16 q, k, v and o against the single chip on the same bf16 inputs: the output matmuls take
# bf16 operands (chunk.py's bf16 policy), so a state that differs from the single chip's in the
# last fp32 bits can round to a different bf16 and flip outputs by 2^-8; measured 4.5e-3 on o
# (correlated keys, D = 2, 4); the state chain is float32, so the final state keeps TOL.
BF16_TOL = 1e-2


@dataclasses.dataclass(frozen=True)
class CPCase:
    mode: str
    D: int
    t: int = T_LOCAL
    dtype: str = "float32"  # of q, k, v (g, beta, state stay float32)
    final: bool = True
    kv_heads: tuple[int, int] | None = None  # (Hk, Hv); None: the mode's default below

    @property
    def heads(self) -> tuple[int, int]:
        """GQA (2, 4); ulysses by default fewer key heads than ranks (Hk < D ≤ Hv)."""
        if self.kv_heads is not None:
            return self.kv_heads
        return {2: (1, 4), 4: (2, 4), 8: (2, 8)}[self.D] if self.mode == "ulysses" else (2, 4)

    @property
    def rule(self) -> RuleCase:
        return RuleCase(B, self.D * self.t, *self.heads, DK, DV, "mixed", CHUNK)

    @property
    def id(self) -> str:
        return f"{self.mode}-D{self.D}-{self.rule.id}-{self.dtype}-final{int(self.final)}"


def ulysses_head_cases(D: int) -> list[CPCase]:
    """The other two key-head layouts of cp_modes.UlyssesHeads: D divides Hk (no copies), and
    neither divides the other (one key head per value head)."""
    return [CPCase("ulysses", D, kv_heads=(D, 2 * D)), CPCase("ulysses", D, kv_heads=(3, 3 * D))]


def cases_for(D: int) -> list[CPCase]:
    return [c for m in MODES for c in (CPCase(m, D), CPCase(m, D, t=2 * T_LOCAL, final=False),
                                       CPCase(m, D, dtype="bfloat16"))] + ulysses_head_cases(D)


def global_inputs(case: CPCase) -> dict[str, np.ndarray]:
    """Global inputs (float32 numpy) and loss weights W_o [B, T, Hv, Dv], W_f [B, Hv, Dk, Dv].

    Mild decay (g = log U(0.95, 1)) so that states carry across ranks, and strong decay
    (g = −20, a near-reset) on a few tokens of one (batch, head) pair only, so that the other
    heads still carry the state (and its gradient) across every rank.
    """
    x = make_inputs(case.rule, seed=case.D)
    rng = np.random.default_rng(100 + case.D)
    x["g"] = np.log(rng.uniform(0.95, 1.0, x["g"].shape)).astype(np.float32)
    T = case.rule.T
    x["g"][0, [5, T // 2 + 3, T - 6], 1] = -20.0
    x["W_o"] = rng.standard_normal(x["v"].shape).astype(np.float32)
    x["W_f"] = rng.standard_normal(x["initial_state"].shape).astype(np.float32)
    return x


def as_tensors(x: dict[str, np.ndarray], case: CPCase, seq: slice) -> dict[str, torch.Tensor]:
    """Leaf tensors for the rule (shard `seq` of the tokens); q, k, v in the case's dtype."""
    out = {}
    for n in NAMES:
        a = torch.tensor(x[n] if n == "initial_state" else x[n][:, seq])
        out[n] = (a.to(getattr(torch, case.dtype)) if n in ("q", "k", "v") else a).requires_grad_()
    return out


def loss_of(o, final, x, seq, scale):
    loss = (o.float() * torch.tensor(x["W_o"][:, seq])).sum()
    return loss if final is None else loss + (final * torch.tensor(x["W_f"])).sum() * scale


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def run_case(rank: int, D: int, case: CPCase, group=None) -> dict:
    """One rank of one case: the shard's o, the final state, input grads, counted bytes
    (`rank` of the CP `group`; None: the world)."""
    x = global_inputs(case)
    seq = slice(rank * case.t, (rank + 1) * case.t)
    xs = as_tensors(x, case, seq)
    with count_comm() as comm:
        o, final = chunk_gated_delta_rule_cp(
            *(xs[n] for n in NAMES[:5]), group=group, mode=case.mode,
            initial_state=xs["initial_state"], output_final_state=case.final,
            use_qk_l2norm=True, chunk_size=CHUNK)
        # The final-state term is the same on every rank, weighted 1/D: the ranks' losses sum to
        # the single-chip loss.
        loss_of(o, final, x, seq, 1.0 / D).backward()
    # None: unused on this rank (initial_state in p2p on ranks > 0)
    out = {n: np32(torch.zeros_like(xs[n]) if xs[n].grad is None else xs[n].grad) for n in NAMES}
    out.update(o=np32(o), final=None if final is None else np32(final), dtype=str(o.dtype),
               comm_forward=comm.forward_bytes, comm_backward=comm.backward_bytes,
               mode_forward=comm.bytes_of(case.mode, "forward"),
               mode_backward=comm.bytes_of(case.mode, "backward"))
    return out


def run_halo(rank: int, D: int) -> dict:
    """exchange_conv_halo on x [B, 5, 6] per rank, halo 3; loss Σ halo · W_r."""
    rng = np.random.default_rng(7)
    x_all = rng.standard_normal((B, D * HALO_T, HALO_C)).astype(np.float32)
    W = rng.standard_normal((D, B, HALO, HALO_C)).astype(np.float32)
    x = torch.tensor(x_all[:, rank * HALO_T:(rank + 1) * HALO_T]).requires_grad_()
    with count_comm() as comm:
        halo = exchange_conv_halo(x, halo=HALO, group=None)
        (halo * torch.tensor(W[rank])).sum().backward()
    try:
        exchange_conv_halo(x, halo=HALO_T + 1, group=None)
        short = "no error"
    except ValueError as e:
        short = str(e)
    return dict(x_all=x_all, W=W, halo=np32(halo), grad=np32(x.grad), short=short,
                forward=comm.forward_bytes, backward=comm.backward_bytes)


def error_message(D: int, mode: str, Hk: int, Hv: int) -> str:
    q = torch.zeros(1, 4, Hk, 8)
    try:
        chunk_gated_delta_rule_cp(q, q, torch.zeros(1, 4, Hv, 8), torch.zeros(1, 4, Hv),
                                  torch.zeros(1, 4, Hv), group=None, mode=mode)
    except ValueError as e:
        return str(e)
    return "no error"


def cp_job(rank: int, D: int) -> dict:
    """Everything one rank computes for world size D (runs inside the spawned process)."""
    out = {case.id: run_case(rank, D, case) for case in cases_for(D)}
    out["halo"] = run_halo(rank, D)
    out["unknown_mode"] = error_message(D, "ring", 2, 4)
    out["ulysses_heads"] = error_message(D, "ulysses", 1, D + 1)
    if D == 4:
        out["subgroups"] = subgroup_cases(rank)
    return out


def subgroup_cases(rank: int) -> dict:
    """Every mode on CP groups {0, 1} and {2, 3} of a world of 4: the group without global
    rank 0 is where a collective taking a group rank for a global one fails."""
    import torch.distributed as dist

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    return {m: run_case(rank % 2, 2, CPCase(m, 2), group=groups[rank // 2]) for m in MODES}


@functools.cache
def cp_results(D: int) -> list[dict]:
    """Spawn D gloo ranks once per D and run every case there."""
    return run_in_process_group(cp_job, world_size=D, args=(), timeout_s=150)


@functools.cache
def reference(case: CPCase) -> dict:
    """The single-chip rule on the full sequence (and the recurrence's output), with grads."""
    x = global_inputs(case)
    xs = as_tensors(x, case, slice(None))
    o, final = chunk_gated_delta_rule(*(xs[n] for n in NAMES[:5]), initial_state=xs["initial_state"],
                                      output_final_state=True, use_qk_l2norm=True, chunk_size=CHUNK)
    loss_of(o, final if case.final else None, x, slice(None), 1.0).backward()
    o_rec, _ = recurrent_gated_delta_rule(*(xs[n].detach() for n in NAMES[:5]),
                                          initial_state=xs["initial_state"].detach(),
                                          use_qk_l2norm=True)
    # What the last shard would output if no state crossed ranks (h_in = initial_state).
    last = slice((case.D - 1) * case.t, None)
    o_alone, _ = chunk_gated_delta_rule(*(xs[n].detach()[:, last] for n in NAMES[:5]),
                                        initial_state=xs["initial_state"].detach(),
                                        use_qk_l2norm=True, chunk_size=CHUNK)
    return dict({n: np32(xs[n].grad) for n in NAMES}, o=np32(o), final=np32(final),
                o_recurrent=np32(o_rec), o_last_alone=np32(o_alone))


def gathered(ranks: list[dict]) -> dict:
    """Per-rank results joined into global ones: shards along T, initial_state grads summed."""
    out = {n: np.concatenate([r[n] for r in ranks], axis=1) for n in ("o",) + NAMES[:5]}
    out["initial_state"] = np.sum([r["initial_state"] for r in ranks], axis=0)
    return out


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("t", [T_LOCAL, 2 * T_LOCAL], ids=lambda t: f"t{t}")
def test_cp_matches_single_chip(mode, D, t):
    case = CPCase(mode, D, t=t, final=t == T_LOCAL)
    ranks, ref = cp_results(D), reference(case)
    got = gathered([r[case.id] for r in ranks])
    # The test is only meaningful if the state crossing ranks matters to the last shard.
    assert rel_err(ref["o"][:, (D - 1) * t:], ref["o_last_alone"]) > 100 * TOL
    for name in ("o",) + NAMES:
        assert_close(f"{case.id}: {name}", ref[name], got[name], TOL)
    assert_close(f"{case.id}: o vs recurrence", ref["o_recurrent"], got["o"], TOL)
    if case.final:
        assert all(np.array_equal(r[case.id]["final"], ranks[0][case.id]["final"]) for r in ranks)
        assert_close(f"{case.id}: final_state", ref["final"], ranks[0][case.id]["final"], TOL)
    else:
        assert all(r[case.id]["final"] is None for r in ranks)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", ["D-divides-Hk", "neither-divides"])
def test_ulysses_key_head_layouts(layout, D):
    """ulysses with Hk ≥ D (no copies) and with Hk, D coprime: values, state and gradients
    equal the single chip's (the default cases above have Hk < D: key heads copied)."""
    case = ulysses_head_cases(D)[layout == "neither-divides"]
    ranks, ref = cp_results(D), reference(case)
    got = gathered([r[case.id] for r in ranks])
    for name in ("o",) + NAMES:
        assert_close(f"{case.id}: {name}", ref[name], got[name], TOL)
    assert_close(f"{case.id}: o vs recurrence", ref["o_recurrent"], got["o"], TOL)
    assert_close(f"{case.id}: final_state", ref["final"], ranks[0][case.id]["final"], TOL)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_cp_bf16_inputs(mode, D):
    """bf16 q, k, v: o comes back bf16; within BF16_TOL of the single chip on the same inputs."""
    case = CPCase(mode, D, dtype="bfloat16")
    ranks, ref = cp_results(D), reference(case)
    assert ranks[0][case.id]["dtype"] == "torch.bfloat16"
    got = gathered([r[case.id] for r in ranks])
    for name in ("o",) + NAMES:
        assert_close(f"{case.id}: {name}", ref[name], got[name], BF16_TOL)
    assert_close(f"{case.id}: final_state", ref["final"], ranks[0][case.id]["final"], TOL)


def table_bytes(case: CPCase, rank: int) -> tuple[int, int]:
    """(forward, backward) bytes of the rule's exchange for `rank`, from docs/architecture.md."""
    D, (Hk, Hv) = case.D, case.heads
    state, pair = B * Hv * DK * DV * 4, B * Hv * DK * (DK + DV) * 4
    rounds = [2 ** i for i in range(math.ceil(math.log2(D)))]
    if case.mode == "p2p":
        return state * (rank > 0), state * (rank < D - 1)
    if case.mode == "all_gather":
        return (D - 1) * pair, (D - 1) * pair
    if case.mode == "log_scan":
        fwd, bwd = sum(d <= rank for d in rounds), sum(rank + d < D for d in rounds)
        assert max(fwd, bwd) <= math.ceil(math.log2(D))
        return fwd * pair, bwd * pair
    # Each rank receives G key heads of q and k (copies when Hk < D), Hv/D value heads of v,
    # g, beta, and Hv/D heads of o back, from each of the D − 1 others.
    G = Hk // D if Hk % D == 0 else 1 if D % Hk == 0 else Hv // D
    channels = 2 * G * DK + (Hv // D) * (DV + 2) + (Hv // D) * DV
    ulysses = (D - 1) * B * case.t * channels * 4
    return ulysses, ulysses


def final_state_bytes(case: CPCase, rank: int) -> tuple[int, int]:
    """(forward, backward) bytes of sharing the final state: broadcast from D−1, all-gather."""
    D, state = case.D, B * case.heads[1] * DK * DV * 4
    if not case.final or case.mode == "all_gather":
        return 0, 0
    if case.mode == "ulysses":
        return (D - 1) * state // D, (D - 1) * state // D
    return state * (rank != D - 1), (D - 1) * state * (rank == D - 1)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_comm_bytes_match_table(mode, D):
    """Counted bytes per rank = the table, nothing else crosses, flat in T for summary modes."""
    ranks = cp_results(D)
    short, long = CPCase(mode, D), CPCase(mode, D, t=2 * T_LOCAL, final=False)
    for case in (short, long) + tuple(ulysses_head_cases(D) if mode == "ulysses" else ()):
        for rank, r in enumerate(ranks):
            got = r[case.id]
            fwd, bwd = table_bytes(case, rank)
            extra_f, extra_b = final_state_bytes(case, rank)
            assert (got["mode_forward"], got["mode_backward"]) == (fwd, bwd), (case.id, rank)
            assert (got["comm_forward"], got["comm_backward"]) == (fwd + extra_f, bwd + extra_b)
    for rank, r in enumerate(ranks):
        growth = 2 if mode == "ulysses" else 1  # ∝ local tokens, or independent of T
        assert r[long.id]["mode_forward"] == growth * r[short.id]["mode_forward"], rank
        assert r[long.id]["mode_backward"] == growth * r[short.id]["mode_backward"], rank


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_conv_halo(D):
    """The halo is the previous rank's last tokens (zeros on rank 0); its gradient flows back."""
    ranks = cp_results(D)
    for rank, r in enumerate(ranks):
        h = r["halo"]
        start = rank * HALO_T
        expect = np.zeros_like(h["halo"]) if rank == 0 else h["x_all"][:, start - HALO:start]
        np.testing.assert_array_equal(h["halo"], expect)
        grad = np.zeros((B, HALO_T, HALO_C), np.float32)
        if rank < D - 1:
            grad[:, -HALO:] = h["W"][rank + 1]
        np.testing.assert_array_equal(h["grad"], grad)
        nbytes = B * HALO * HALO_C * 4
        assert (h["forward"], h["backward"]) == (nbytes * (rank > 0), nbytes * (rank < D - 1))
        assert f"{HALO_T} tokens" in h["short"] and f"{HALO_T + 1} tokens" in h["short"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_validation_errors(D):
    r = cp_results(D)[0]
    assert all(m in r["unknown_mode"] for m in ("'ring'",) + MODES), r["unknown_mode"]
    msg = r["ulysses_heads"]
    assert f"value heads ({D + 1}) divisible by chips={D}" in msg, msg
    assert "chips must be one of 1" in msg, msg


@pytest.mark.slow  # the world-of-4 job
@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", MODES)
def test_modes_on_cp_subgroups(mode):
    """CP groups inside a larger world (a data-parallel × CP mesh): each group of two equals
    one chip on its sequence, the group holding global ranks 2, 3 included."""
    ranks = cp_results(4)
    ref = reference(CPCase(mode, 2))
    for group in (ranks[0:2], ranks[2:4]):
        got = gathered([r["subgroups"][mode] for r in group])
        for name in ("o",) + NAMES:
            assert_close(f"{mode} {name}", ref[name], got[name], TOL)
