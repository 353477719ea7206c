"""Packed documents (cu_seqlens) under every PyTorch GDN CP mode and layout, on real gloo
process groups (spawned ranks), against one chip.

Every rank gets the global cu_seqlens and finds its own boundaries. Oracles: the one-chip rule
with the same cu_seqlens (itself checked against each document alone and the recurrence in
test_torch_packed_documents.py) and the recurrence; the one-chip GatedDeltaNet with
cu_seqlens (layer). Two boundary sets per D: `spanning` (a 1-token document, then one document
over every shard: its state crosses every CP boundary) and `edges` (starts on every zigzag
segment edge, so on every contiguous shard edge, on a chunk edge and a 1-token document after
it). Each case runs twice: through this package's CP rule, and under kernels="fused" through the
kernel composition (cp.kernel_rule, the code fla-core's kernel takes) with the reference rule
kernel as its stand-in (fla itself, interpreted: test_torch_fused_interpreted.py). One spawned
job per D runs every case on every rank and returns numpy arrays.
Legend: D ranks, t tokens per rank (two zigzag segments of t/2), T = D·t.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from gdn_core.config import GDNConfig
from gdn_core.cp_layout import LAYOUTS, local_positions
from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import (
    GatedDeltaNet,
    chunk_gated_delta_rule,
    context_parallel,
    recurrent_gated_delta_rule,
)
from gdn_core.torch_gdn.cp import chunk_gated_delta_rule_cp
from gdn_core.torch_gdn.gdn_kernels import ReferenceGDNKernel

from .rule_inputs import RuleCase, make_inputs
from .torch_dist import run_in_process_group

MODES = CP_MODES
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
CHUNK, T_LOCAL, DK, DV, TOL = 16, 24, 16, 16, 1e-4
BOUNDARIES = ("spanning", "edges")
KERNELS = ("reference", "fused")


def cu_seqlens(kind: str, D: int) -> tuple[int, ...]:
    T, s = D * T_LOCAL, T_LOCAL // 2
    if kind == "spanning":
        return (0, 5, 6, T - 7, T)
    starts = {s * i for i in range(1, 2 * D)} | {CHUNK, CHUNK + 1}
    return (0, *sorted(starts), T)


@dataclasses.dataclass(frozen=True)
class Case:
    mode: str
    layout: str
    D: int
    boundaries: str

    @property
    def rule(self) -> RuleCase:
        # Realistic keys (a shared direction per head), β ∈ U(0.5, 1), weak decay: the state
        # would carry across every document boundary if it could.
        return RuleCase(1, self.D * T_LOCAL, 2, 4, DK, DV, "weak", CHUNK)

    @property
    def cu(self) -> tuple[int, ...]:
        return cu_seqlens(self.boundaries, self.D)

    @property
    def id(self) -> str:
        return f"{self.mode}-{self.layout}-D{self.D}-{self.boundaries}"


def cases(D: int) -> list[Case]:
    return [Case(m, lay, D, b) for m in MODES for lay in LAYOUTS for b in BOUNDARIES]


def global_inputs(case: Case) -> dict[str, np.ndarray]:
    x = make_inputs(case.rule, seed=case.D)
    rng = np.random.default_rng(100 + case.D)
    x["W_o"] = rng.standard_normal(x["v"].shape).astype(np.float32)
    x["W_f"] = rng.standard_normal(x["initial_state"].shape).astype(np.float32)
    return x


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def positions(rank: int, D: int, layout: str) -> np.ndarray:
    return local_positions(chip=rank, chips=D, seq_len=D * T_LOCAL, layout=layout)


def run_rule(rank: int, D: int, case: Case, kernel=None) -> dict:
    """One rank: its o shard (local order), the final state and the input gradients; `kernel`
    a rule kernel composed with the exchanges (None: this package's CP rule)."""
    x = global_inputs(case)
    pos = positions(rank, D, case.layout)
    xs = {n: torch.tensor(x[n] if n == "initial_state" else x[n][:, pos]).requires_grad_()
          for n in NAMES}
    o, final = chunk_gated_delta_rule_cp(
        *(xs[n] for n in NAMES[:5]), group=None, mode=case.mode, layout=case.layout,
        initial_state=xs["initial_state"], output_final_state=True, use_qk_l2norm=True,
        chunk_size=CHUNK, cu_seqlens=torch.tensor(case.cu), kernel=kernel)
    loss = (o * torch.tensor(x["W_o"][:, pos])).sum() + (final * torch.tensor(x["W_f"])).sum() / D
    loss.backward()
    grads = {n: np32(torch.zeros_like(xs[n]) if xs[n].grad is None else xs[n].grad)
             for n in NAMES}  # None: the state never reaches this rank's outputs
    return dict(grads, o=np32(o), final=np32(final))


# --- the layer -------------------------------------------------------------------------------

CFG = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8,
                conv_kernel_size=4, chunk_size=CHUNK)


def make_layer(cfg: GDNConfig = CFG) -> GatedDeltaNet:
    """Seeded weights, slow decay (A ≤ 0.1) so that state would cross documents if it could."""
    layer = GatedDeltaNet(cfg)
    gen = torch.Generator().manual_seed(0)
    layer.reset_parameters(gen)
    with torch.no_grad():
        layer.A_log.copy_(torch.empty(cfg.num_v_heads).uniform_(0.005, 0.1, generator=gen).log())
    return layer


def layer_data(D: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(D)
    shape = (1, D * T_LOCAL, CFG.hidden_size)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


def run_layer(rank: int, D: int, case: Case, kernels: str = "reference") -> dict:
    """One rank: the CP layer's output shard, input and parameter gradients."""
    x, W = layer_data(D)
    pos = positions(rank, D, case.layout)
    stand_in = {"gdn_kernel": "reference"} if kernels == "fused" else {}
    cp = context_parallel(make_layer(), group=None,
                          cp=CPSettings(mode=case.mode, chips=D, layout=case.layout,
                                        kernels=kernels), **stand_in)
    x_local = torch.tensor(x[:, pos]).requires_grad_()
    y = cp(x_local, torch.tensor(case.cu))
    (y * torch.tensor(W[:, pos])).sum().backward()
    return {"y": np32(y), "dx": np32(x_local.grad),
            "grads": {n: np32(p.grad) for n, p in cp.named_parameters()}}


def job(rank: int, D: int) -> dict:
    out = {c.id: run_rule(rank, D, c) for c in cases(D)}
    out.update({"fused-" + c.id: run_rule(rank, D, c, ReferenceGDNKernel(CHUNK))
                for c in cases(D)})
    out.update({f"layer-{kernels}-" + c.id: run_layer(rank, D, c, kernels)
                for c in cases(D) for kernels in KERNELS})
    try:  # every rank raises before any exchange
        chunk_gated_delta_rule_cp(*(torch.zeros(1, T_LOCAL, 1, 8) for _ in range(3)),
                                  torch.zeros(1, T_LOCAL, 1), torch.zeros(1, T_LOCAL, 1),
                                  group=None, mode="p2p", cu_seqlens=torch.tensor([0, T_LOCAL]))
        out["short_cu"] = "no error"
    except ValueError as e:
        out["short_cu"] = str(e)
    return out


@functools.cache
def spawned(D: int) -> list[dict]:
    return run_in_process_group(job, world_size=D, timeout_s=120 + 60 * D)


def gathered(ranks: list[dict], name: str, D: int, layout: str) -> np.ndarray:
    first = ranks[0][name]
    full = np.zeros(first.shape[:1] + (D * T_LOCAL,) + first.shape[2:], first.dtype)
    for rank, r in enumerate(ranks):
        full[:, positions(rank, D, layout)] = r[name]
    return full


@functools.cache
def rule_reference(case: Case) -> dict:
    x = global_inputs(case)
    xs = {n: torch.tensor(x[n]).requires_grad_() for n in NAMES}
    cu = torch.tensor(case.cu)
    o, final = chunk_gated_delta_rule(*(xs[n] for n in NAMES[:5]),
                                      initial_state=xs["initial_state"], output_final_state=True,
                                      use_qk_l2norm=True, chunk_size=CHUNK, cu_seqlens=cu)
    ((o * torch.tensor(x["W_o"])).sum() + (final * torch.tensor(x["W_f"])).sum()).backward()
    o_rec, final_rec = recurrent_gated_delta_rule(
        *(xs[n].detach() for n in NAMES[:5]), initial_state=xs["initial_state"].detach(),
        output_final_state=True, use_qk_l2norm=True, cu_seqlens=cu)
    return dict({n: np32(xs[n].grad) for n in NAMES}, o=np32(o), final=np32(final),
                o_recurrent=np32(o_rec), final_recurrent=np32(final_rec))


@functools.cache
def layer_reference(D: int, cu: tuple[int, ...]) -> dict:
    x, W = layer_data(D)
    layer = make_layer()
    x_t = torch.tensor(x, requires_grad=True)
    y = layer(x_t, torch.tensor(cu))
    (y * torch.tensor(W)).sum().backward()
    return {"y": np32(y), "dx": np32(x_t.grad),
            "grads": {n: np32(p.grad) for n, p in layer.named_parameters()}}


DS = [2, pytest.param(4, marks=pytest.mark.slow)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("boundaries", BOUNDARIES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_packed_cp_rule_matches_one_chip(mode, layout, boundaries, kernels, D):
    case = Case(mode, layout, D, boundaries)
    key = case.id if kernels == "reference" else "fused-" + case.id
    ranks = [r[key] for r in spawned(D)]
    ref = rule_reference(case)
    o = gathered(ranks, "o", D, layout)
    assert_close("o", ref["o"], o, TOL)
    assert_close("o vs recurrence", ref["o_recurrent"], o, TOL)
    for rank, r in enumerate(ranks):
        assert_close(f"final_state rank {rank}", ref["final"], r["final"], TOL)
    assert_close("final_state vs recurrence", ref["final_recurrent"], ranks[0]["final"], TOL)
    floor = 1e-3 * float(np.linalg.norm(ref["v"]))
    for n in NAMES[:5]:
        assert_close(f"d{n}", ref[n], gathered(ranks, n, D, layout), TOL, floor=floor)
    assert_close("dinitial_state", ref["initial_state"],
                 sum(r["initial_state"] for r in ranks), TOL)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("boundaries", BOUNDARIES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_packed_cp_layer_matches_one_chip(mode, layout, boundaries, kernels, D):
    case = Case(mode, layout, D, boundaries)
    ranks = [r[f"layer-{kernels}-" + case.id] for r in spawned(D)]
    ref = layer_reference(D, case.cu)
    assert_close("y", ref["y"], gathered(ranks, "y", D, layout), TOL)
    assert_close("dx", ref["dx"], gathered(ranks, "dx", D, layout), TOL)
    for n, g in ref["grads"].items():
        assert_close(f"d{n}", g, sum(r["grads"][n] for r in ranks), TOL)


@pytest.mark.timeout(400)
def test_cu_seqlens_must_cover_the_global_sequence():
    message = spawned(2)[0]["short_cu"]
    assert f"seq_len={2 * T_LOCAL}" in message, message
