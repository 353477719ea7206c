"""Context-parallel GatedDeltaNet layer and model, every mode, on real gloo process groups.

The oracle is the single-chip GatedDeltaNet (or GDNLanguageModel) on the full sequence. One
spawned job per D runs every case on every rank and returns numpy arrays; the tests only
compare. Legend: D ranks, t tokens per rank, B batch, C conv channels, Hk/Hv heads.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn import GatedDeltaNet, GDNLanguageModel, context_parallel
from gdn_core.torch_gdn.cp import ContextParallelGatedDeltaNet, count_comm

from .torch_dist import run_in_process_group

MODES = CP_MODES
# D = 2 in the default tier; D = 4 and 8 in the slow tier (test_torch_cp.py keeps D = 4 at the
# rule level: p2p's multi-hop wavefront and log_scan's second round).
DS = [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
B, T_LOCAL = 2, 24  # t = 24 tokens per rank: not a multiple of the 16-token chunk


def gdn_cfg(D: int) -> GDNConfig:
    """Hk = 4, Hv = 8 (GQA r = 2) for D ≤ 4, Hk = D, Hv = 2·D above: ulysses divides them."""
    Hk = max(4, D)
    return GDNConfig(hidden_size=32, num_k_heads=Hk, num_v_heads=2 * Hk, head_k_dim=8,
                     head_v_dim=8, conv_kernel_size=4, chunk_size=16)


def ulysses_cfgs(D: int) -> dict[str, GDNConfig]:
    """ulysses layouts beyond gdn_cfg's (D divides Hk): fewer key heads than ranks (each key
    head's q, k conv channels go to every rank that needs them), and Hk, D coprime."""
    def cfg(Hk: int, Hv: int) -> GDNConfig:
        return dataclasses.replace(gdn_cfg(D), num_k_heads=Hk, num_v_heads=Hv)
    return {"Hk<D": cfg(max(1, D // 4), D if D > 2 else 4), "coprime": cfg(3, 3 * D)}


def model_cfg(D: int) -> ModelConfig:
    return ModelConfig(name="custom", gdn=gdn_cfg(D), num_layers=2, intermediate_size=64,
                       vocab_size=64)
TOL = 1e-4


def make_layer(cfg: GDNConfig) -> GatedDeltaNet:
    """The test layer: seeded weights, slow decay (A ≤ 0.1) so state crosses the ranks."""
    layer = GatedDeltaNet(cfg)
    gen = torch.Generator().manual_seed(0)
    layer.reset_parameters(gen)
    with torch.no_grad():
        layer.A_log.copy_(torch.empty(cfg.num_v_heads).uniform_(0.005, 0.1, generator=gen).log())
        layer.dt_bias.copy_(torch.randn(cfg.num_v_heads, generator=gen))  # not all-equal heads
    return layer


def layer_data(D: int) -> tuple[np.ndarray, np.ndarray]:
    """Input x and loss weights W, both [B, D·t, hidden] float32."""
    rng = np.random.default_rng(D)
    shape = (B, D * T_LOCAL, gdn_cfg(D).hidden_size)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


def layer_comm_bytes(cfg: GDNConfig, mode: str, *, D: int, rank: int, B: int, t: int,
                     itemsize: int = 4) -> tuple[int, int]:
    """(forward, backward) bytes one CP layer receives on `rank`, from docs/architecture.md's table.

    Sequence-sharded modes add the conv halo, B·(K−1)·C from the previous rank; ulysses sends
    each rank, from each of the D − 1 others, the pre-conv q, k channels of the G key heads its
    value heads use (copies when Hk < D) and v, a, b of its Hv/D value heads, and brings o back.
    """
    Hk, Hv, Dk, Dv, C = (cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim,
                         cfg.conv_dim)
    if mode == "ulysses":
        G = Hk // D if Hk % D == 0 else 1 if D % Hk == 0 else Hv // D
        widths = (2 * G * Dk + (Hv // D) * (Dv + 2), (Hv // D) * Dv)  # in, o back
        each = sum((D - 1) * B * t * width * itemsize for width in widths)
        return each, each
    halo = B * (cfg.conv_kernel_size - 1) * C * itemsize
    fwd, bwd = halo * (rank > 0), halo * (rank < D - 1)
    state, pair = B * Hv * Dk * Dv * 4, B * Hv * Dk * (Dk + Dv) * 4  # fp32 state always
    if mode == "p2p":
        return fwd + state * (rank > 0), bwd + state * (rank < D - 1)
    if mode == "all_gather":
        return fwd + (D - 1) * pair, bwd + (D - 1) * pair
    rounds = [2 ** i for i in range(math.ceil(math.log2(D)))]  # log_scan
    return (fwd + pair * sum(d <= rank for d in rounds),
            bwd + pair * sum(rank + d < D for d in rounds))


def np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def run_layer(rank: int, D: int, mode: str, cfg: GDNConfig) -> dict:
    """One rank: the CP layer's output shard, input and parameter gradients, counted bytes."""
    x, W = layer_data(D)
    seq = slice(rank * T_LOCAL, (rank + 1) * T_LOCAL)
    layer = make_layer(cfg)
    cp = context_parallel(layer, group=None, cp=CPSettings(mode=mode, chips=D))
    x_local = torch.tensor(x[:, seq]).requires_grad_()
    with count_comm() as comm:
        y = cp(x_local)
        (y * torch.tensor(W[:, seq])).sum().backward()
    shared = [p is q for p, q in zip(layer.parameters(), cp.parameters(), strict=True)]
    return {"y": np32(y), "dx": np32(x_local.grad), "shared": all(shared),
            "names": [n for n, _ in cp.named_parameters()],
            "grads": {n: np32(p.grad) for n, p in cp.named_parameters()},
            "forward": comm.forward_bytes, "backward": comm.backward_bytes}


def run_model(rank: int, D: int, mode: str) -> dict:
    """One rank: logits of a whole GDNLanguageModel made context-parallel (in place)."""
    tokens = torch.from_numpy(synthetic_tokens(batch_size=B, seq_len=D * T_LOCAL,
                                               vocab_size=model_cfg(D).vocab_size)).long()
    model = GDNLanguageModel(model_cfg(D), seed=1)
    names = list(model.state_dict())
    same = context_parallel(model, group=None, cp=CPSettings(mode=mode, chips=D))
    with torch.no_grad():
        logits = model(tokens[:, rank * T_LOCAL:(rank + 1) * T_LOCAL])
    return {"logits": np32(logits), "in_place": same is model,
            "names_kept": list(same.state_dict()) == names,
            "cp_layers": sum(isinstance(m, ContextParallelGatedDeltaNet) for m in model.modules())}


def error_of(cfg: GDNConfig, mode: str, t: int, D: int) -> str:
    """The ValueError message of a CP layer's forward on a [1, t, hidden] shard."""
    cp = context_parallel(GatedDeltaNet(cfg), group=None, cp=CPSettings(mode=mode, chips=D))
    try:
        cp(torch.zeros(1, t, cfg.hidden_size))
    except ValueError as e:
        return str(e)
    return "no error"


def layer_job(rank: int, D: int) -> dict:
    """Everything one rank computes for world size D (runs inside the spawned process)."""
    out = {f"layer-{m}": run_layer(rank, D, m, gdn_cfg(D)) for m in MODES}
    out.update({f"layer-ulysses-{name}": run_layer(rank, D, "ulysses", cfg)
                for name, cfg in ulysses_cfgs(D).items()})
    out.update({f"model-{m}": run_model(rank, D, m) for m in MODES})
    odd_heads = GDNConfig(hidden_size=16, num_k_heads=1, num_v_heads=D + 1, head_k_dim=4,
                          head_v_dim=4)
    out["ulysses_heads"] = error_of(odd_heads, "ulysses", t=8, D=D)
    out["short_shard"] = error_of(gdn_cfg(D), "p2p", t=gdn_cfg(D).conv_kernel_size - 2, D=D)
    return out


@functools.cache
def layer_results(D: int) -> list[dict]:
    """Spawn D gloo ranks once per D and run every case there."""
    return run_in_process_group(layer_job, world_size=D, timeout_s=150)


@functools.cache
def layer_reference(D: int, cfg: GDNConfig) -> dict:
    """The single-chip layer on the full sequence, with the same loss, plus the last shard
    run alone (no state or halo from earlier ranks)."""
    x, W = layer_data(D)
    layer = make_layer(cfg)
    x_full = torch.tensor(x).requires_grad_()
    y = layer(x_full)
    (y * torch.tensor(W)).sum().backward()
    with torch.no_grad():
        y_last_alone = layer(torch.tensor(x[:, (D - 1) * T_LOCAL:]))
    return {"y": np32(y), "dx": np32(x_full.grad), "y_last_alone": np32(y_last_alone),
            "grads": {n: np32(p.grad) for n, p in layer.named_parameters()}}


def layer_case(layout: str, D: int) -> tuple[str, GDNConfig]:
    """(mode, config) of a layer case: a mode name, or 'ulysses-<name of ulysses_cfgs>'."""
    if layout.startswith("ulysses-"):
        return "ulysses", ulysses_cfgs(D)[layout.removeprefix("ulysses-")]
    return layout, gdn_cfg(D)


LAYOUTS = MODES + ("ulysses-Hk<D", "ulysses-coprime")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cp_layer_matches_single_chip(layout, D):
    """Gathered output and input gradient, and rank-summed parameter gradients, equal one chip."""
    mode, cfg = layer_case(layout, D)
    ranks, ref = [r[f"layer-{layout}"] for r in layer_results(D)], layer_reference(D, cfg)
    case = f"{layout}-D{D}-B{B}-t{T_LOCAL}-Hk{cfg.num_k_heads}-Hv{cfg.num_v_heads}"
    # Only meaningful if what crosses ranks (state, halo) changes the last shard's output.
    last = slice((D - 1) * T_LOCAL, None)
    assert rel_err(ref["y"][:, last], ref["y_last_alone"]) > 100 * TOL
    assert all(r["shared"] for r in ranks), "CP layer must hold the layer's own Parameters"
    assert all(r["names"] == list(ref["grads"]) for r in ranks)
    assert_close(f"{case}: y", ref["y"], np.concatenate([r["y"] for r in ranks], axis=1), TOL)
    assert_close(f"{case}: dx", ref["dx"], np.concatenate([r["dx"] for r in ranks], axis=1), TOL)
    for name, grad in ref["grads"].items():
        assert_close(f"{case}: d{name}", grad, sum(r["grads"][name] for r in ranks), TOL)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cp_layer_comm_bytes(layout, D):
    """Bytes each rank receives in one forward + backward = the table, halo included."""
    mode, cfg = layer_case(layout, D)
    for rank, r in enumerate(layer_results(D)):
        got = r[f"layer-{layout}"]
        expect = layer_comm_bytes(cfg, mode, D=D, rank=rank, B=B, t=T_LOCAL)
        assert (got["forward"], got["backward"]) == expect, (layout, D, rank)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", MODES)
def test_cp_model_logits_match_single_chip(mode, D):
    """context_parallel on a GDNLanguageModel swaps its layers in place; logits equal one chip."""
    ranks = [r[f"model-{mode}"] for r in layer_results(D)]
    tokens = torch.from_numpy(synthetic_tokens(batch_size=B, seq_len=D * T_LOCAL,
                                               vocab_size=model_cfg(D).vocab_size)).long()
    with torch.no_grad():
        ref = GDNLanguageModel(model_cfg(D), seed=1)(tokens[:, :-1])
    assert all(r["in_place"] and r["names_kept"] for r in ranks)
    assert all(r["cp_layers"] == model_cfg(D).num_layers for r in ranks)
    assert_close(f"{mode}-D{D}: logits", ref, np.concatenate([r["logits"] for r in ranks], 1),
                 TOL)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_cp_layer_shape_errors_name_the_numbers(D):
    r = layer_results(D)[0]
    msg = r["ulysses_heads"]
    assert f"value heads ({D + 1}) divisible by chips={D}" in msg, msg
    msg = r["short_shard"]
    assert "local shard of 2 tokens" in msg and "conv halo of 3 tokens" in msg, msg


@pytest.mark.timeout(10)
def test_context_parallel_argument_errors():
    """Checked before any process group is touched, so no spawn is needed."""
    with pytest.raises(ValueError, match="mode='ring' is not one of: ulysses, p2p"):
        context_parallel(GatedDeltaNet(gdn_cfg(2)), group=None, cp=CPSettings(mode="ring", chips=2))
    with pytest.raises(ValueError, match="Linear contains no GatedDeltaNet"):
        context_parallel(nn.Linear(2, 2), group=None, cp=CPSettings(mode="p2p", chips=2))
    cp = context_parallel(GatedDeltaNet(gdn_cfg(2)), group=None, cp=CPSettings(mode="p2p", chips=2))
    with pytest.raises(ValueError, match="already context-parallel"):
        context_parallel(cp, group=None, cp=CPSettings(mode="p2p", chips=2))
    model = GDNLanguageModel(model_cfg(2))
    model.layers[0].gdn = context_parallel(model.layers[0].gdn, group=None,
                                           cp=CPSettings(mode="p2p", chips=2))
    with pytest.raises(ValueError, match=r"has 1 layer\(s\) already context-parallel"):
        context_parallel(model, group=None, cp=CPSettings(mode="log_scan", chips=2))
    assert type(model.layers[1].gdn) is GatedDeltaNet  # nothing swapped by the failed call
