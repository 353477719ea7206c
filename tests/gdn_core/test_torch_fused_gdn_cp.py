"""torch GDN under kernels="fused": a one-chip rule kernel (torch_gdn.gdn_kernels; fla-core's on
CUDA) composed with the CP exchanges through its public call (cp.kernel_rule), and the
resolver that says which kernel runs or why none can.

fla-core runs only on CUDA, so on CPU the `reference` kernel is injected as its stand-in and
goes through the SAME composition code (summary call from an identity initial state, the
mode's exchange, replay call from h_in). The oracles are test_torch_cp_zigzag's: the
single-chip rule and the token-by-token recurrence on realistic inputs (keys of a head at
cosine 0.9 to a shared direction, β ∈ U(0.5, 1), weak decay with near-resets g = −20), and the
single-chip GatedDeltaNet. One spawned gloo job per D runs every case; the tests compare.
Legend: D ranks, t tokens per rank, B batch, Hk/Hv key/value heads, K/V head dims.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from gdn_core import kernels as rule_book
from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import CPSettings
from gdn_core.kernels import FLA_GDN, KernelUnavailable, resolve_kernels
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn import HybridLanguageModel, context_parallel
from gdn_core.torch_gdn.chunk import fold_chunk_pairs, prepare_chunks
from gdn_core.torch_gdn.cp import (
    ContextParallelGatedDeltaNet,
    chunk_gated_delta_rule_cp,
    count_comm,
)
from gdn_core.torch_gdn.cp.kernel_rule import kernel_summary
from gdn_core.torch_gdn.gdn_kernels import (
    FlaGDNKernel,
    ReferenceGDNKernel,
    gdn_rule_kernel,
    resolve_torch_gdn_kernel,
)

from . import test_torch_cp as contiguous_cp  # its bf16 cases, inputs and oracle
from .rule_inputs import RuleCase, make_inputs
from .test_torch_cp_zigzag import (
    CHUNK,
    MODES,
    NAMES,
    T_LONG,
    TOL,
    RuleCPCase,
    gathered,
    gdn_cfg,
    global_inputs,
    layer_data,
    layer_reference,
    make_layer,
    np32,
    positions,
    rule_reference,
    zigzag_layer_bytes,
    zigzag_rule_bytes,
)
from .torch_dist import run_in_process_group

DS = [2, pytest.param(4, marks=pytest.mark.slow)]
CUDA_REASON = "fla-core's chunk_gated_delta_rule needs a CUDA device"


@dataclasses.dataclass
class CountingKernel:
    """A rule kernel that counts its calls, to show which code ran the rule."""

    inner: ReferenceGDNKernel
    calls: int = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def rule_cases(D: int) -> list[RuleCPCase]:
    return [c for m in MODES for lay in LAYOUTS
            for c in (RuleCPCase(m, lay, D), RuleCPCase(m, lay, D, t=T_LONG, final=False))]


def run_rule(rank: int, D: int, case: RuleCPCase) -> dict:
    """One rank of one case through the kernel composition: o shard, final, input grads, bytes
    and the kernel's calls."""
    x = global_inputs(case)
    pos = positions(rank, D, case.rule.T, case.layout)
    xs = {n: torch.tensor(x[n] if n == "initial_state" else x[n][:, pos]).requires_grad_()
          for n in NAMES}
    kernel = CountingKernel(ReferenceGDNKernel(CHUNK))
    with count_comm() as comm:
        o, final = chunk_gated_delta_rule_cp(
            *(xs[n] for n in NAMES[:5]), group=None, mode=case.mode, layout=case.layout,
            initial_state=xs["initial_state"], output_final_state=case.final,
            use_qk_l2norm=True, kernel=kernel)
        loss = (o * torch.tensor(x["W_o"][:, pos])).sum()
        if final is not None:  # the same term on every rank, weighted 1/D
            loss = loss + (final * torch.tensor(x["W_f"])).sum() / D
        loss.backward()
    out = {n: np32(torch.zeros_like(xs[n]) if xs[n].grad is None else xs[n].grad) for n in NAMES}
    out.update(o=np32(o), final=None if final is None else np32(final), calls=kernel.calls,
               forward=comm.forward_bytes, backward=comm.backward_bytes)
    return out


def run_layer(rank: int, D: int, mode: str, layout: str, remat: bool) -> dict:
    """One rank of a GatedDeltaNet made context-parallel under kernels="fused" with the
    reference kernel as fla's stand-in."""
    x, W = layer_data(D)
    pos = positions(rank, D, x.shape[1], layout)
    cp = context_parallel(make_layer(gdn_cfg(D)), group=None,
                          cp=CPSettings(mode=mode, chips=D, layout=layout,
                                        kernels="fused"), gdn_kernel="reference")
    chosen = type(cp.gdn_kernel).__name__
    cp.gdn_kernel = kernel = CountingKernel(cp.gdn_kernel)
    cp.recompute_core = remat
    x_local = torch.tensor(x[:, pos]).requires_grad_()
    with count_comm() as comm:
        y = cp(x_local)
        (y * torch.tensor(W[:, pos])).sum().backward()
    return {"y": np32(y), "dx": np32(x_local.grad), "kernel": chosen, "calls": kernel.calls,
            "grads": {n: np32(p.grad) for n, p in cp.named_parameters()},
            "forward": comm.forward_bytes, "backward": comm.backward_bytes}


LAYER_CASES = [("contiguous", False), ("zigzag", False), ("zigzag", True)]


def run_bf16(rank: int, D: int, mode: str) -> dict:
    """One rank of test_torch_cp's bf16 case (q, k, v in bf16) through the kernel composition."""
    case = contiguous_cp.CPCase(mode, D, dtype="bfloat16")
    x = contiguous_cp.global_inputs(case)
    seq = slice(rank * case.t, (rank + 1) * case.t)
    xs = contiguous_cp.as_tensors(x, case, seq)
    o, final = chunk_gated_delta_rule_cp(
        *(xs[n] for n in NAMES[:5]), group=None, mode=mode, initial_state=xs["initial_state"],
        output_final_state=True, use_qk_l2norm=True,
        kernel=ReferenceGDNKernel(contiguous_cp.CHUNK))
    contiguous_cp.loss_of(o, final, x, seq, 1.0 / D).backward()
    return dict({n: np32(torch.zeros_like(xs[n]) if xs[n].grad is None else xs[n].grad)
                 for n in NAMES}, o=np32(o), final=np32(final), dtype=str(o.dtype))


def refusals(D: int) -> dict:
    """What kernels="fused" does on CPU without a stand-in: run_cp_training refuses before any
    collective; a layer given fla's kernel raises rather than running anything else."""
    from gdn_core.presets import get_preset
    from gdn_core.torch_gdn.cp.train import run_cp_training
    from gdn_core.train_config import TrainConfig

    out = {}
    try:
        run_cp_training(get_preset("tiny", num_layers=1), TrainConfig(seq_len=16 * D),
                        group=None, cp=CPSettings(mode="p2p", chips=D, kernels="fused"), steps=1)
        out["run"] = "no error"
    except KernelUnavailable as err:
        out["run"] = str(err)
    cp = context_parallel(make_layer(gdn_cfg(D)), group=None,
                          cp=CPSettings(mode="all_gather", chips=D, kernels="fused"))
    out["layer_kernel"] = type(cp.gdn_kernel).__name__
    try:
        cp(torch.zeros(1, 16, gdn_cfg(D).hidden_size))
        out["layer"] = "no error"
    except KernelUnavailable as err:
        out["layer"] = str(err)
    return out


def fused_job(rank: int, D: int) -> dict:
    out = {case.id: run_rule(rank, D, case) for case in rule_cases(D)}
    out.update({(m, lay, remat): run_layer(rank, D, m, lay, remat)
                for m in MODES for lay, remat in LAYER_CASES})
    out.update({("bf16", m): run_bf16(rank, D, m) for m in MODES})
    out["refusals"] = refusals(D)
    return out


@functools.cache
def results(D: int) -> list[dict]:
    return run_in_process_group(fused_job, world_size=D, timeout_s=60 + 40 * D)


# --- the composition on gloo -----------------------------------------------------------------

@pytest.mark.timeout(240)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_kernel_composition_matches_single_chip_and_recurrence(mode, layout, D):
    """Through the kernel: o, the final state and the gradients of q, k, v, g, beta and h0
    equal the one-chip rule's (o and the final state the recurrence's too), fp32; the kernel
    ran once per rank (ulysses) or twice per segment (summary, replay); the bytes received
    are the reference path's table (zigzag), nothing more crosses."""
    ranks = results(D)
    for case in (RuleCPCase(mode, layout, D), RuleCPCase(mode, layout, D, T_LONG, final=False)):
        ref, got_ranks = rule_reference(case), [r[case.id] for r in ranks]
        assert rel_err(ref["o"][:, -ref["o_last"]:], ref["o_last_alone"]) > 100 * TOL
        got = gathered(got_ranks, ("o",) + NAMES[:5], D, case.rule.T, layout)
        got["initial_state"] = np.sum([r["initial_state"] for r in got_ranks], axis=0)
        for name in ("o",) + NAMES:
            assert_close(f"kernel {case.id}: {name}", ref[name], got[name], TOL)
        assert_close(f"kernel {case.id}: o vs recurrence", ref["o_recurrent"], got["o"], TOL)
        if case.final:
            assert all(np.array_equal(r["final"], got_ranks[0]["final"]) for r in got_ranks)
            assert_close(f"kernel {case.id}: final", ref["final"], got_ranks[0]["final"], TOL)
            assert_close(f"kernel {case.id}: final vs recurrence", ref["final_recurrent"],
                         got_ranks[0]["final"], TOL)
        else:
            assert all(r["final"] is None for r in got_ranks)
        segments = 2 if layout == "zigzag" else 1
        assert {r["calls"] for r in got_ranks} == {1 if mode == "ulysses" else 2 * segments}
        if layout == "zigzag":
            for rank, r in enumerate(got_ranks):
                assert (r["forward"], r["backward"]) == zigzag_rule_bytes(case, rank), rank


@pytest.mark.timeout(240)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize(("layout", "remat"), LAYER_CASES,
                         ids=["contiguous", "zigzag", "zigzag-remat"])
@pytest.mark.parametrize("mode", MODES)
def test_fused_layer_matches_single_chip(mode, layout, remat, D):
    """context_parallel(kernels="fused", gdn_kernel="reference"): the layers hold the chosen
    kernel and call it (not this package's CP rule); output, input gradient and rank-summed
    parameter gradients equal the single-chip layer's, also with the core recomputed."""
    ranks, ref = [r[(mode, layout, remat)] for r in results(D)], layer_reference(D)
    case = f"fused-layer-{mode}-{layout}{'-remat' if remat else ''}-D{D}"
    assert {r["kernel"] for r in ranks} == {"ReferenceGDNKernel"}
    assert all(r["calls"] > 0 for r in ranks)
    got = gathered(ranks, ("y", "dx"), D, ref["y"].shape[1], layout)
    assert_close(f"{case}: y", ref["y"], got["y"], TOL)
    assert_close(f"{case}: dx", ref["dx"], got["dx"], TOL)
    for name, grad in ref["grads"].items():
        assert_close(f"{case}: d{name}", grad, sum(r["grads"][name] for r in ranks), TOL)
    if layout == "zigzag":
        for rank, r in enumerate(ranks):
            fwd, bwd = zigzag_layer_bytes(mode, D, rank)
            assert (r["forward"], r["backward"]) == (fwd * (1 + remat), bwd), rank


@pytest.mark.timeout(240)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_kernel_composition_bf16_inputs(mode, D):
    """bf16 q, k, v (the summary computes in float32): o comes back bf16 within test_torch_cp's
    BF16_TOL of the single chip on the same inputs, gradients too; the final state within TOL."""
    case = contiguous_cp.CPCase(mode, D, dtype="bfloat16")
    ranks, ref = [r[("bf16", mode)] for r in results(D)], contiguous_cp.reference(case)
    assert ranks[0]["dtype"] == "torch.bfloat16"
    got = contiguous_cp.gathered(ranks)
    for name in ("o",) + NAMES:
        assert_close(f"kernel {case.id}: {name}", ref[name], got[name], contiguous_cp.BF16_TOL)
    assert_close(f"kernel {case.id}: final", ref["final"], ranks[0]["final"], TOL)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_fused_on_cpu_is_refused_never_run_as_the_reference(D):
    """No stand-in given: run_cp_training raises the CUDA reason on every rank (the trial is
    skipped with it), and a layer built under kernels="fused" holds fla's kernel, whose call
    on CPU raises instead of running anything else."""
    for r in results(D):
        refused = r["refusals"]
        assert refused["run"].startswith(CUDA_REASON), refused
        assert refused["layer_kernel"] == "FlaGDNKernel"
        assert CUDA_REASON in refused["layer"], refused


# --- one process -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", [
    RuleCase(2, 100, 1, 2, 16, 8, "weak", 16, cosine=0.97),
    RuleCase(1, 64, 2, 4, 8, 16, "strong", 32),
    RuleCase(1, 37, 2, 2, 16, 16, "mixed", 16, keys="iid"),
], ids=lambda c: c.id)
def test_kernel_summary_is_the_fold_pair(case):
    """One call from initial_state [I | 0] with values [0 | v] returns our fold's pair [A | b]
    (A [K, K] acting on the state's key side: h ↦ A h + b), and A h + b is the kernel's own
    final state from h: the sign and transpose conventions agree."""
    x = {n: torch.tensor(a) for n, a in make_inputs(case, seed=3).items()}
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    kernel = ReferenceGDNKernel(case.chunk_size)
    P = kernel_summary(kernel, *args, use_qk_l2norm=True)
    terms = prepare_chunks(*args, use_qk_l2norm=True, chunk_size=case.chunk_size)
    A, b = fold_chunk_pairs(terms.A_NBHKK, terms.b_NBHKV)
    K = case.Dk
    assert P.shape == (case.B, case.Hv, K, K + case.Dv) and P.dtype == torch.float32
    assert_close(f"{case.id}: A", A, P[..., :K], 1e-5)
    assert_close(f"{case.id}: b", b, P[..., K:], 1e-5)
    h = x["initial_state"]
    _, final = kernel(*args, initial_state=h, output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
    assert_close(f"{case.id}: A h + b", final, P[..., :K] @ h + P[..., K:], 1e-5)


def test_resolver_on_cpu_names_cuda_and_reference_composes_nothing():
    with pytest.raises(KernelUnavailable, match=f"^{CUDA_REASON}.*this trial runs on cpu"):
        resolve_torch_gdn_kernel("fused", device="cpu", dtype="float32", chunk_size=64,
                                 head_k_dim=128)
    assert resolve_torch_gdn_kernel("reference", device="cpu", dtype=torch.float32,
                                    chunk_size=128, head_k_dim=512) == (
        "reference torch chunk rule", None)
    with pytest.raises(KernelUnavailable, match=CUDA_REASON):
        FlaGDNKernel(64)(*(torch.zeros(1, 4, 1, 8),) * 3, torch.zeros(1, 4, 1),
                         torch.zeros(1, 4, 1))


@pytest.fixture
def fla(monkeypatch):
    """fla-core present (True) or absent (False) as the rule book sees it."""
    def set_installed(installed: bool) -> None:
        monkeypatch.setattr(rule_book, "_fla_installed", lambda: installed)
    return set_installed


def test_rule_book_names_fla_on_gpu_when_installed_and_says_why_not(fla):
    fla(True)
    got = resolve_kernels("torch", "fused", device_kind="gpu", dtype="bfloat16", head_dim=None,
                          has_attention=False, gdn_head_k_dim=128, gdn_chunk_size=64)
    assert got.gdn == FLA_GDN.format(version=rule_book._version("fla-core"))
    assert got.gdn.startswith("fla-core ") and got.gdn.endswith(" chunk_gated_delta_rule")
    with pytest.raises(KernelUnavailable, match=r"takes chunk_size 16, 32, 64, got "
                       r"chunk_size=128 and serves head_k_dim up to 256, got head_k_dim=512"):
        resolve_kernels("torch", "fused", device_kind="gpu", dtype="bfloat16", head_dim=None,
                        has_attention=False, gdn_head_k_dim=512, gdn_chunk_size=128)
    if not torch.cuda.is_available():  # the rule book says fla; this host has no GPU to run it
        with pytest.raises(KernelUnavailable, match="CUDA is not available"):
            resolve_torch_gdn_kernel("fused", device="cuda", dtype="bfloat16", chunk_size=64,
                                     head_k_dim=128)
    fla(False)
    with pytest.raises(KernelUnavailable, match=r"fla-core is not installed .*pip install "
                                                r"fla-core"):
        resolve_kernels("torch", "fused", device_kind="gpu", dtype="bfloat16", head_dim=None,
                        has_attention=False)


def test_context_parallel_gives_gdn_layers_the_kernel_of_kernels():
    """fused → fla's kernel at each layer's chunk size (never the reference unless asked);
    reference → none (this package's CP rule, unchanged)."""
    from gdn_core.presets import get_preset

    def kernels_of(kernels, **kwargs):
        model = HybridLanguageModel(get_preset("tiny", layers="hybrid", num_layers=2))
        context_parallel(model, group=None, cp=CPSettings(mode="p2p", chips=2, kernels=kernels),
                         **kwargs)
        return [m.gdn_kernel for m in model.modules()
                if isinstance(m, ContextParallelGatedDeltaNet)]

    fused = kernels_of(kernels="fused")
    assert fused and all(isinstance(k, FlaGDNKernel) and k.name == "fla" for k in fused)
    assert kernels_of(kernels="reference") == [None] * len(fused)
    assert all(isinstance(k, ReferenceGDNKernel)
               for k in kernels_of(kernels="fused", gdn_kernel="reference"))
    with pytest.raises(ValueError, match="gdn_kernel='reference' is for kernels='fused'"):
        kernels_of(kernels="reference", gdn_kernel="reference")
    with pytest.raises(ValueError, match="gdn_kernel='triton' is not one of: reference, fla"):
        gdn_rule_kernel("triton")
    with pytest.raises(KernelUnavailable, match="chunk_size 16, 32, 64, got chunk_size=128"):
        gdn_rule_kernel("fla", chunk_size=128)


# --- on a GPU (scripts/device-check.sh) ------------------------------------------------------

def two_segments(kernel, q, k, v, g, beta, h0):
    """p2p's composition at D = 2 on one device: the first half's summary carries h0 to the
    second half, which the kernel replays from it; (o [B, T, Hv, V], final state)."""
    half, K = q.shape[1] // 2, k.shape[-1]
    first, second = ([x[:, part] for x in (q, k, v, g, beta)]
                     for part in (slice(None, half), slice(half, None)))
    P1 = kernel_summary(kernel, *first, use_qk_l2norm=True)
    h_in = P1[..., :K] @ h0 + P1[..., K:]
    o1, _ = kernel(*first, initial_state=h0, use_qk_l2norm_in_kernel=True)
    o2, final = kernel(*second, initial_state=h_in, output_final_state=True,
                       use_qk_l2norm_in_kernel=True)
    return torch.cat([o1, o2], dim=1), final


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fla_kernel_through_the_composition_on_cuda(dtype):
    """fla's kernel on one GPU (GVA Hv = 2·Hk, K = V = 64, correlated keys): its summary equals
    the reference kernel's pair; two segments composed through the summary equal one fla call
    over the whole sequence; outputs, final state and the gradients of q, k, v, g, beta, h0
    through the composition equal the reference kernel's (float32 inputs) within the
    tolerance of fla's dots (TF32 in float32, bf16 operands in bf16). Tolerances are estimates:
    this test has not run on a GPU here."""
    pytest.importorskip("fla")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    case = RuleCase(1, 256, 2, 4, 64, 64, "weak", 64, cosine=0.9)
    x = make_inputs(case, seed=5)
    rng = np.random.default_rng(6)
    W_o = torch.tensor(rng.standard_normal(x["v"].shape), dtype=torch.float32, device="cuda")
    W_f = torch.tensor(rng.standard_normal(x["initial_state"].shape), dtype=torch.float32,
                       device="cuda")
    names = ("q", "k", "v", "g", "beta", "initial_state")

    def run(kernel, in_dtype):
        xs = {n: torch.tensor(x[n], device="cuda")
              .to(in_dtype if n in ("q", "k", "v") else torch.float32).requires_grad_()
              for n in names}
        o, final = two_segments(kernel, *(xs[n] for n in names))
        ((o.float() * W_o).sum() + (final * W_f).sum()).backward()
        return dict({n: xs[n].grad for n in names}, o=o, final=final), xs

    fla_kernel, ref_kernel = gdn_rule_kernel("fla"), ReferenceGDNKernel(64)
    got, xs = run(fla_kernel, dtype)
    want, _ = run(ref_kernel, torch.float32)
    for name in ("o", "final") + names:
        assert_close(f"fla composed vs reference {dtype}: {name}", want[name], got[name], tol)
    args = [xs[n].detach() for n in names[:5]]
    with torch.no_grad():
        o_all, final_all = fla_kernel(*args, initial_state=xs["initial_state"].detach(),
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert_close(f"fla summary {dtype}", kernel_summary(ref_kernel, *args, use_qk_l2norm=True),
                     kernel_summary(fla_kernel, *args, use_qk_l2norm=True), tol)
    assert_close(f"fla composed vs one call {dtype}: o", o_all, got["o"], tol)
    assert_close(f"fla composed vs one call {dtype}: final", final_all, got["final"], tol)
