"""fla-core's chunk_gated_delta_rule run on this CPU under Triton's interpreter
(gdn_core.interpreted_kernels), alone and composed with every torch CP mode, layout and packed
documents (cp.kernel_rule), at rule, layer and hybrid-step level, on gloo ranks.

Oracles: this package's one-chip rule and its token-by-token recurrence (packed documents
included), transformers' torch_chunk_gated_delta_rule, and the one-chip GatedDeltaNet / model.
Inputs are realistic: keys of a head sharing a direction (cosine 0.9), β ∈ U(0.5, 1), weak
decay, so state would leak across a document boundary if it could. float32 within 1e-4 (fla's
interpreted kernels compute in float32; numpy has no bfloat16).
Default tier: a covering subset on D = 2 (T per rank 64, Hk = 1, Hv = 2, K = V = 32); every
mode × layout × documents product under `slow`.
Legend: D ranks, t tokens per rank, T = D·t, Hk/Hv key/value heads, K/V head dims.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from gdn_core.config import GDNConfig
from gdn_core.cp_layout import LAYOUTS, local_positions
from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.interpreted_kernels import INTERPRET_ENV
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import GatedDeltaNet, chunk_gated_delta_rule, recurrent_gated_delta_rule
from gdn_core.torch_gdn.cp import chunk_gated_delta_rule_cp, context_parallel, count_comm
from gdn_core.torch_gdn.fla_interpreter import SHIMS_WRITTEN_FOR
from gdn_core.torch_gdn.gdn_kernels import FlaCPContextKernel, FlaGDNKernel

from .rule_inputs import RuleCase, make_inputs
from .test_torch_cp_packed_documents import make_layer as seeded_slow_decay_layer
from .torch_dist import run_in_process_group

MODES = CP_MODES
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
DOCUMENTS = ("single", "spanning", "edges")
CHUNK, T_LOCAL, HK, HV, DK, DV, TOL = 16, 64, 1, 2, 32, 32, 1e-4


def fla(**kwargs) -> FlaGDNKernel:
    return FlaGDNKernel(CHUNK, interpreted=True, **kwargs)


def fla_cp_context() -> FlaCPContextKernel:
    return FlaCPContextKernel(CHUNK, interpreted=True)


@dataclasses.dataclass(frozen=True)
class Case:
    mode: str
    layout: str
    documents: str
    D: int = 2

    @property
    def T(self) -> int:
        return self.D * T_LOCAL

    @property
    def cu(self) -> tuple[int, ...] | None:
        """single: none; spanning: a 1-token document, then one over every shard; edges: a
        start on every zigzag segment edge (so every shard edge), a chunk edge and the token
        after it."""
        T, s = self.T, T_LOCAL // 2
        if self.documents == "single":
            return None
        if self.documents == "spanning":
            return (0, 5, 6, T - 7, T)
        return (0, *sorted({s * i for i in range(1, 2 * self.D)} | {CHUNK, CHUNK + 1}), T)

    @property
    def id(self) -> str:
        return f"{self.mode}-{self.layout}-{self.documents}-D{self.D}"


ALL_CASES = [Case(m, lay, d) for m in MODES for lay in LAYOUTS for d in DOCUMENTS]
DEFAULT_CASES = [Case("ulysses", "zigzag", "edges"), Case("p2p", "contiguous", "spanning"),
                 Case("all_gather", "zigzag", "single"), Case("log_scan", "zigzag", "edges"),
                 Case("p2p", "zigzag", "edges"), Case("all_gather", "contiguous", "edges")]


def case_params(cases_wanted):
    return [pytest.param(c, id=c.id, marks=() if c in DEFAULT_CASES else pytest.mark.slow)
            for c in cases_wanted]


def inputs(T: int, seed: int = 0) -> dict[str, np.ndarray]:
    x = make_inputs(RuleCase(1, T, HK, HV, DK, DV, "weak", CHUNK), seed=seed)
    rng = np.random.default_rng(100 + seed)
    x["W_o"] = rng.standard_normal(x["v"].shape).astype(np.float32)
    x["W_f"] = rng.standard_normal(x["initial_state"].shape).astype(np.float32)
    return x


def np32(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().numpy()


def cu_tensor(cu):
    return None if cu is None else torch.tensor(cu)


# --- one process: the kernel itself ------------------------------------------------------------

def run_rule_alone(rule, x, **kwargs) -> dict:
    xs = {n: torch.tensor(x[n]).requires_grad_() for n in NAMES}
    o, final = rule(*(xs[n] for n in NAMES[:5]), initial_state=xs["initial_state"],
                    output_final_state=True, **kwargs)
    ((o * torch.tensor(x["W_o"])).sum() + (final * torch.tensor(x["W_f"])).sum()).backward()
    return dict({n: np32(xs[n].grad) for n in NAMES}, o=np32(o), final=np32(final))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("documents", [None, (0, 30, 31, 96, 128)], ids=["single", "packed"])
def test_interpreted_fla_matches_our_rule_and_the_recurrence(monkeypatch, documents):
    """fla under the interpreter (its varlen path for packed documents, the rows side by side):
    o, final state and the gradients of q, k, v, g, beta and h0 equal our chunk rule's; o and
    the final state the token-by-token recurrence's."""
    monkeypatch.setenv(INTERPRET_ENV, "1")
    x = inputs(128, seed=1)
    x = {n: np.concatenate([a, a[:, ::-1].copy()]) if n != "initial_state" else
         np.concatenate([a, 0.5 * a]) for n, a in x.items()}  # B = 2 rows, different data
    cu = cu_tensor(documents)
    got = run_rule_alone(fla(), x, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    want = run_rule_alone(functools.partial(chunk_gated_delta_rule, chunk_size=CHUNK), x,
                          use_qk_l2norm=True, cu_seqlens=cu)
    for name in ("o", "final") + NAMES:
        assert_close(f"fla vs ours: {name}", want[name], got[name], TOL)
    o_rec, final_rec = recurrent_gated_delta_rule(
        *(torch.tensor(x[n]) for n in NAMES[:5]), initial_state=torch.tensor(x["initial_state"]),
        output_final_state=True, use_qk_l2norm=True, cu_seqlens=cu)
    assert_close("fla vs recurrence: o", np32(o_rec), got["o"], TOL)
    assert_close("fla vs recurrence: final", np32(final_rec), got["final"], TOL)


@pytest.mark.timeout(120)
def test_interpreted_fla_matches_transformers(monkeypatch):
    """transformers' torch_chunk_gated_delta_rule (Qwen3.5's, GVA by repeating key heads) on
    the same inputs: o, final state and every gradient."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    monkeypatch.setenv(INTERPRET_ENV, "1")
    x = inputs(128, seed=2)

    def transformers_rule(q, k, v, g, beta, *, initial_state, output_final_state):
        r = v.shape[2] // q.shape[2]
        return torch_chunk_gated_delta_rule(
            q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2), v, g, beta,
            chunk_size=CHUNK, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=True)

    got = run_rule_alone(fla(), x, use_qk_l2norm_in_kernel=True)
    want = run_rule_alone(transformers_rule, x)
    for name in ("o", "final") + NAMES:
        assert_close(f"fla vs transformers: {name}", want[name], got[name], TOL)


# --- the shims ---------------------------------------------------------------------------------

def test_the_shims_are_written_for_the_installed_versions():
    """A new Triton or fla-core may break the shims or make one unneeded: the versions they
    were checked against are named, and an upgrade fails here until the next two tests have
    been rerun against it and SHIMS_WRITTEN_FOR updated."""
    installed = {name: importlib.metadata.version(name) for name in SHIMS_WRITTEN_FOR}
    assert installed == SHIMS_WRITTEN_FOR


SHIM_PROBE = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from gdn_core.torch_gdn.fla_interpreter import install_shims
    install_shims(autotuner=sys.argv[1] == "1", loop_index=sys.argv[2] == "1")
    x = torch.randn(1, 64, 1, 32)
    try:
        o, _ = chunk_gated_delta_rule(x, x, torch.randn(1, 64, 2, 32), -torch.rand(1, 64, 2),
                                      torch.rand(1, 64, 2), use_qk_l2norm_in_kernel=True)
        print("RAN", bool(torch.isfinite(o).all()))
    except Exception as error:
        print("RAISED", type(error).__name__, error)
""")


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("autotuner", "loop_index", "needed"), [
    (True, True, None), (False, True, "active drivers"), (True, False, "attribute 'to'")],
    ids=["both", "without-autotuner-shim", "without-loop-index-shim"])
def test_each_shim_is_still_needed(autotuner, loop_index, needed):
    """With both shims fla's forward runs under the interpreter; leaving either out fails the
    way it did when the shim was written (so a version that no longer needs it fails here)."""
    done = subprocess.run([sys.executable, "-c", SHIM_PROBE, str(int(autotuner)),
                           str(int(loop_index))], capture_output=True, text=True, timeout=170,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    last = (done.stdout.strip().splitlines() or [done.stderr[-2000:]])[-1]
    if needed is None:
        assert last == "RAN True", done.stderr[-2000:]
    else:
        assert last.startswith("RAISED") and needed in last, last


# --- gloo ranks: rule, layer and one chip -----------------------------------------------------

def positions(rank: int, D: int, layout: str) -> np.ndarray:
    return local_positions(chip=rank, chips=D, seq_len=D * T_LOCAL, layout=layout)


def run_rule(rank: int, case: Case, kernel=None, *, states: bool = True) -> dict:
    """One rank through `kernel` (default fla under our composition); states=False: no
    initial state in, no final state out (all fla's own cp_context takes)."""
    kernel = kernel or fla()
    x = inputs(case.T, seed=case.D)
    pos = positions(rank, case.D, case.layout)
    xs = {n: torch.tensor(x[n] if n == "initial_state" else x[n][:, pos]).requires_grad_()
          for n in NAMES}
    o, final = chunk_gated_delta_rule_cp(
        *(xs[n] for n in NAMES[:5]), group=None, mode=case.mode, layout=case.layout,
        initial_state=xs["initial_state"] if states else None, output_final_state=states,
        use_qk_l2norm=True, kernel=kernel, cu_seqlens=cu_tensor(case.cu))
    loss = (o * torch.tensor(x["W_o"][:, pos])).sum()
    if states:
        loss = loss + (final * torch.tensor(x["W_f"])).sum() / case.D
    loss.backward()
    out = {n: np32(torch.zeros_like(xs[n]) if xs[n].grad is None else xs[n].grad) for n in NAMES}
    return dict(out, o=np32(o), final=np32(final) if states else None)


CFG = GDNConfig(hidden_size=64, num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV,
                conv_kernel_size=4, chunk_size=CHUNK)


def make_layer() -> GatedDeltaNet:
    """Seeded weights, slow decay, so that state would cross documents if it could."""
    return seeded_slow_decay_layer(CFG)


def layer_data(T: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(T)
    return tuple(rng.standard_normal((1, T, CFG.hidden_size)).astype(np.float32)
                 for _ in range(2))


def run_layer(rank: int, case: Case) -> dict:
    """One rank of a GatedDeltaNet under kernels="fused" (the switch on: fla interpreted)."""
    x, W = layer_data(case.T)
    pos = positions(rank, case.D, case.layout)
    cp = context_parallel(make_layer(), group=None,
                          cp=CPSettings(mode=case.mode, chips=case.D, layout=case.layout,
                                        kernels="fused"))
    x_local = torch.tensor(x[:, pos]).requires_grad_()
    y = cp(x_local, cu_tensor(case.cu))
    (y * torch.tensor(W[:, pos])).sum().backward()
    return {"y": np32(y), "dx": np32(x_local.grad), "kernel": repr(cp.gdn_kernel),
            "grads": {n: np32(p.grad) for n, p in cp.named_parameters()}}


def job(rank: int, world: int, cases: tuple[Case, ...], part: str) -> dict:
    """part "composed": fla under our composition (rule and layer); "cp_context": fla's own
    CP beside our composition, both without states (all_gather cases)."""
    os.environ[INTERPRET_ENV] = "1"
    out = {}
    for c in cases:
        if part == "composed":
            out[("rule", c.id)], out[("layer", c.id)] = run_rule(rank, c), run_layer(rank, c)
        elif c.mode == "all_gather":
            out[("cp_context", c.id)] = run_rule(rank, c, fla_cp_context(), states=False)
            out[("ours_stateless", c.id)] = run_rule(rank, c, fla(), states=False)
    return out


@functools.cache
def spawned(cases: tuple[Case, ...], part: str) -> list[dict]:
    return run_in_process_group(functools.partial(job, cases=cases, part=part), world_size=2,
                                timeout_s=120 + 25 * len(cases))


def results_for(case: Case, part: str = "composed") -> list[dict]:
    """A default case runs in a job of its own (a few seconds: each test's budget); a slow
    run's product in one job."""
    return spawned((case,) if case in DEFAULT_CASES else tuple(ALL_CASES), part)


def gathered(ranks: list[dict], name: str, case: Case) -> np.ndarray:
    first = ranks[0][name]
    full = np.zeros(first.shape[:1] + (case.T,) + first.shape[2:], first.dtype)
    for rank, r in enumerate(ranks):
        full[:, positions(rank, case.D, case.layout)] = r[name]
    return full


@functools.cache
def rule_reference(case: Case) -> dict:
    x = inputs(case.T, seed=case.D)
    cu = cu_tensor(case.cu)
    ref = run_rule_alone(functools.partial(chunk_gated_delta_rule, chunk_size=CHUNK), x,
                         use_qk_l2norm=True, cu_seqlens=cu)
    o_rec, final_rec = recurrent_gated_delta_rule(
        *(torch.tensor(x[n]) for n in NAMES[:5]), initial_state=torch.tensor(x["initial_state"]),
        output_final_state=True, use_qk_l2norm=True, cu_seqlens=cu)
    return dict(ref, o_recurrent=np32(o_rec), final_recurrent=np32(final_rec))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", case_params(ALL_CASES))
def test_interpreted_fla_under_cp_matches_one_chip_and_recurrence(case):
    """fla composed with the mode's exchanges (summary at width K+V and replay; ulysses one
    call; packed documents as segment-local cu_seqlens): o, the final state on every rank and
    the gradients of q, k, v, g, beta and h0 equal the one-chip rule's, and the recurrence's."""
    ranks, ref = [r[("rule", case.id)] for r in results_for(case)], rule_reference(case)
    o = gathered(ranks, "o", case)
    assert_close(f"{case.id}: o", ref["o"], o, TOL)
    assert_close(f"{case.id}: o vs recurrence", ref["o_recurrent"], o, TOL)
    for rank, r in enumerate(ranks):
        assert_close(f"{case.id}: final rank {rank}", ref["final"], r["final"], TOL)
    assert_close(f"{case.id}: final vs recurrence", ref["final_recurrent"], ranks[0]["final"],
                 TOL)
    floor = 1e-3 * float(np.linalg.norm(ref["v"]))
    for n in NAMES[:5]:
        assert_close(f"{case.id}: d{n}", ref[n], gathered(ranks, n, case), TOL, floor=floor)
    assert_close(f"{case.id}: dh0", ref["initial_state"],
                 sum(r["initial_state"] for r in ranks), TOL)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", case_params([c for c in ALL_CASES if c.mode == "all_gather"]))
def test_fla_cp_context_matches_our_composition_and_one_chip(case):
    """fla's own CP (its cp_context, gdn_kernel="fla_cp_context") under all_gather, packed
    documents included: o and the gradients of q, k, v, g, beta equal this package's
    composition of the same fla kernel (within 1e-4, the same ranks and inputs) and the
    one-chip rule; it takes no initial state and gives no final state."""
    ranks = results_for(case, "cp_context")
    ours = [r[("ours_stateless", case.id)] for r in ranks]
    theirs = [r[("cp_context", case.id)] for r in ranks]
    assert all(r["final"] is None for r in theirs)
    ref = rule_reference_without_states(case)
    floor = ref["floor"]
    for n in ("o",) + NAMES[:5]:
        got = gathered(theirs, n, case)
        assert_close(f"{case.id}: cp_context {n} vs ours", gathered(ours, n, case), got, TOL,
                     floor=0 if n == "o" else floor)
        assert_close(f"{case.id}: cp_context {n} vs one chip", ref[n], got, TOL,
                     floor=0 if n == "o" else floor)


@functools.cache
def rule_reference_without_states(case: Case) -> dict:
    x = inputs(case.T, seed=case.D)
    xs = {n: torch.tensor(x[n]).requires_grad_() for n in NAMES[:5]}
    o, _ = chunk_gated_delta_rule(*xs.values(), use_qk_l2norm=True, chunk_size=CHUNK,
                                  cu_seqlens=cu_tensor(case.cu))
    (o * torch.tensor(x["W_o"])).sum().backward()
    return {n: np32(xs[n].grad) for n in NAMES[:5]} | {
        "o": np32(o), "floor": 1e-3 * float(np.linalg.norm(x["v"]))}


def refusals_job(rank: int, world: int) -> dict:
    """fla's cp_context where it cannot serve: every rank raises before any exchange."""
    from gdn_core.kernels import KernelUnavailable

    x = {n: torch.tensor(a[:, :T_LOCAL] if n != "initial_state" else a)
         for n, a in inputs(2 * T_LOCAL).items() if n in NAMES}
    args = [x[n] for n in NAMES[:5]]
    out = {}
    for what, kwargs in {"p2p": dict(mode="p2p"),
                         "h0": dict(mode="all_gather", initial_state=x["initial_state"]),
                         "final": dict(mode="all_gather", output_final_state=True)}.items():
        try:
            chunk_gated_delta_rule_cp(*args, group=None, use_qk_l2norm=True,
                                      kernel=fla_cp_context(), **kwargs)
            out[what] = "no error"
        except KernelUnavailable as err:
            out[what] = str(err)
    return out


@pytest.mark.timeout(300)
def test_fla_cp_context_refuses_what_it_cannot_serve():
    for r in run_in_process_group(refusals_job, world_size=2, timeout_s=200):
        assert "serves the all_gather mode only" in r["p2p"] and "mode='p2p'" in r["p2p"], r
        assert "takes no initial_state" in r["h0"] and "takes no initial_state" in r["final"], r


@functools.cache
def layer_reference(case: Case) -> dict:
    x, W = layer_data(case.T)
    layer = make_layer()
    x_t = torch.tensor(x, requires_grad=True)
    y = layer(x_t, cu_tensor(case.cu))
    (y * torch.tensor(W)).sum().backward()
    return {"y": np32(y), "dx": np32(x_t.grad),
            "grads": {n: np32(p.grad) for n, p in layer.named_parameters()}}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", case_params(ALL_CASES))
def test_interpreted_fused_layer_matches_the_one_chip_layer(case):
    """context_parallel(kernels="fused") with the switch on holds fla's interpreted kernel;
    output, input and rank-summed parameter gradients equal the one-chip GatedDeltaNet's."""
    ranks, ref = [r[("layer", case.id)] for r in results_for(case)], layer_reference(case)
    assert {r["kernel"] for r in ranks} == {repr(fla())}
    assert_close(f"{case.id}: y", ref["y"], gathered(ranks, "y", case), TOL)
    assert_close(f"{case.id}: dx", ref["dx"], gathered(ranks, "dx", case), TOL)
    for n, g in ref["grads"].items():
        assert_close(f"{case.id}: d{n}", g, sum(r["grads"][n] for r in ranks), TOL)


def one_chip_job(rank: int, world: int) -> dict:
    """On one rank: the fused layer makes one fla call per forward and exchanges nothing; the
    reference layer is the plain one bit for bit (no fold, no halo)."""
    os.environ[INTERPRET_ENV] = "1"
    x, _ = layer_data(T_LOCAL)
    cu = torch.tensor((0, 10, 40, T_LOCAL))
    out = {}
    for kernels in ("fused", "reference"):
        plain = make_layer()
        cp = context_parallel(make_layer(), group=None,
                              cp=CPSettings(mode="p2p", chips=1, kernels=kernels))
        calls = []
        if kernels == "fused":
            inner = cp.gdn_kernel
            cp.gdn_kernel = lambda *a, **k: calls.append(1) or inner(*a, **k)
        with count_comm() as comm:
            y = cp(torch.tensor(x), cu)
        y_plain = plain(torch.tensor(x), cu)
        out[kernels] = dict(calls=len(calls), bytes=comm.forward_bytes, y=np32(y),
                            y_plain=np32(y_plain))
    return out


@pytest.mark.timeout(300)
def test_one_chip_is_one_kernel_call_and_the_plain_layer():
    (got,) = run_in_process_group(one_chip_job, world_size=1, timeout_s=200)
    assert (got["fused"]["calls"], got["fused"]["bytes"]) == (1, 0)
    assert_close("one chip fused vs plain", got["fused"]["y_plain"], got["fused"]["y"], TOL)
    assert got["reference"]["bytes"] == 0
    np.testing.assert_array_equal(got["reference"]["y"], got["reference"]["y_plain"])


# --- the hybrid decoder's training step, and what the resolver says ---------------------------

HYBRID_SEQ_LEN = 64
"""Tokens of the hybrid step's sequence: 32 a rank, two 16-token chunks (several documents)."""


def hybrid_step_job(rank: int, world: int, mode: str = "p2p",
                    layout: str = "contiguous") -> dict:
    """run_cp_training of the tiny hybrid decoder (GDN `mode`, attention ring, packed
    documents, `layout`) under kernels="fused" with the switch on, verified against one chip
    (the reference model on the whole batch)."""
    import dataclasses as dc

    from gdn_core.presets import get_preset
    from gdn_core.torch_gdn.cp.train import run_cp_training
    from gdn_core.train_config import TrainConfig

    os.environ[INTERPRET_ENV] = "1"
    model = get_preset("tiny", layers="hybrid", num_layers=2)
    train = dc.replace(TrainConfig(seq_len=HYBRID_SEQ_LEN), documents="uniform:8-24")
    report = run_cp_training(model, train, group=None,
                             cp=CPSettings(mode=mode, chips=2, attn_cp="ring", layout=layout,
                                           kernels="fused"),
                             steps=1, warmup_steps=1, verify=True)
    return dict(err=report.max_rel_err, verified=report.verified_seq_len, losses=report.losses)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "layout"), [
    pytest.param(m, lay, marks=() if (m, lay) == ("p2p", "contiguous") else pytest.mark.slow)
    for m in MODES for lay in LAYOUTS])
def test_interpreted_fused_hybrid_step_matches_one_chip(mode, layout):
    """The whole step (fla interpreted in the GDN layers, SDPA in the attention layers, packed
    documents): the CP loss and every parameter gradient equal the one-chip reference model's
    on the full sequence; the losses are finite."""
    ranks = run_in_process_group(hybrid_step_job, world_size=2, args=(mode, layout),
                                 timeout_s=240)
    for r in ranks:
        assert r["verified"] == HYBRID_SEQ_LEN
        assert r["err"] < TOL, r["err"]
        assert all(np.isfinite(r["losses"]))


def test_resolver_names_the_interpreted_kernel_only_under_the_switch(monkeypatch):
    from gdn_core.kernels import FLA_GDN, KernelUnavailable, resolve_kernels
    from gdn_core.torch_gdn.gdn_kernels import resolve_torch_gdn_kernel

    point = dict(device="cpu", chunk_size=CHUNK, head_k_dim=DK)
    monkeypatch.delenv(INTERPRET_ENV, raising=False)
    with pytest.raises(KernelUnavailable, match=f"needs a CUDA device.*{INTERPRET_ENV}=1"):
        resolve_torch_gdn_kernel("fused", dtype="float32", **point)
    monkeypatch.setenv(INTERPRET_ENV, "1")
    name, kernel = resolve_torch_gdn_kernel("fused", dtype="float32", **point)
    assert name == FLA_GDN.format(version=SHIMS_WRITTEN_FOR["fla-core"]) + " (interpreted)"
    assert kernel == fla()
    with pytest.raises(KernelUnavailable, match="takes dtype float32 under Triton's interpreter"):
        resolve_torch_gdn_kernel("fused", dtype="bfloat16", **point)
    resolved = resolve_kernels("torch", "fused", device_kind="cpu", dtype="float32",
                               head_dim=16, has_attention=True, gdn_head_k_dim=DK,
                               gdn_chunk_size=CHUNK, packed_documents=True)
    assert resolved.gdn == name and not resolved.attention.endswith("(interpreted)")
