"""The attention kernels of one segment pair (torch_gdn.attention_kernels): the fused `sdpa` equals
the reference `tiles` on a pair and through attention_cp on real gloo process groups (every
attn_cp mode × layout, forward and gradients), bf16 against float32 at a stated tolerance, the
kernel choice reaching the attention from run_cp_training's CPSettings, and the resolver's
reasons.

Inputs are realistic: the keys of a head share a direction (cosine ≈ 0.8: a peaked softmax,
and a dq whose large common part cancels), not only i.i.d. Gaussians. The process-group cases
run inside test_torch_cp_hybrid's spawned job (`kernel_job`), as test_torch_cp_attention's do.
Legend: B batch, H query heads, G key/value heads, E head_dim, s tokens of a segment.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import ATTN_CP_MODES, CPSettings
from gdn_core.kernels import KernelUnavailable, attention_kernel_name
from gdn_core.presets import get_preset
from gdn_core.testing import assert_close
from gdn_core.torch_gdn import HybridLanguageModel, context_parallel
from gdn_core.torch_gdn.attention_kernels import (
    ATTENTION_KERNELS,
    SdpaKernel,
    TilesKernel,
    attention_kernel,
    merge_into,
    resolve_torch_attention_kernel,
)
from gdn_core.torch_gdn.attention_kernels.sdpa import cuda_flash_refusal
from gdn_core.torch_gdn.cp.attention import attention_cp
from gdn_core.torch_gdn.cp.hybrid import ContextParallelGatedAttention

from .test_torch_cp_attention import BLOCK, data, positions

FP32_TOL = 1e-5
BF16_TOL = 3e-2
"""bf16 q, k, v (either kernel) against float32: measured on the pair test (3 seeds) o ≤ 6.2e-3,
lse ≤ 9.5e-4, dk, dv ≤ 6.8e-3, dq ≤ 1.8e-2 (sdpa; tiles 9.7e-3: keys sharing a direction
make dq a cancelling sum, which bf16 rounding of dS disturbs most)."""
DS = [2, pytest.param(4, marks=pytest.mark.slow)]
SCALE = 0.25
NAMES = ("o", "lse", "dq", "dk", "dv")


def pair_inputs(seed: int, *, B=2, H=4, G=2, s=24, s_before=40, E=16):
    """q [B, H, s, E] of one segment; keys/values [B, G, s_before + s, E]: an earlier segment of
    s_before tokens (every key precedes the queries) then the queries' own segment (causal);
    dO like q. Keys of a head share a direction (cosine ≈ 0.8)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, s, E, generator=g)
    shared = torch.randn(1, G, 1, E, generator=g)
    k = 0.8 * 3 * shared + 0.6 * torch.randn(B, G, s_before + s, E, generator=g)
    v, do = torch.randn(B, G, s_before + s, E, generator=g), torch.randn(B, H, s, E, generator=g)
    return q, k, v, do


def merged_pairs(kernel_name: str, q, k, v, do, dtype=torch.float32,
                 device="cpu") -> dict[str, torch.Tensor]:
    """The queries against both key segments as two kernel pairs merged by log-sum-exp, and the
    backward of each pair from the FINAL merged (o, lse), summed (what cp.attention does)."""
    kernel = attention_kernel(kernel_name, block=7)  # tiles: several, ragged, per segment
    q, k, v, do = (x.to(device, dtype) for x in (q, k, v, do))
    s = q.shape[2]
    pairs = [(slice(0, k.shape[2] - s), False), (slice(k.shape[2] - s, k.shape[2]), True)]
    o = torch.zeros(q.shape, device=device)
    lse = torch.full(q.shape[:-1], float("-inf"), device=device)
    for k_sl, causal in pairs:
        merge_into(o, lse, *kernel.forward(q, k[:, :, k_sl], v[:, :, k_sl], causal=causal,
                                           scale=SCALE))
    dq, dk, dv = (torch.zeros(x.shape, device=device) for x in (q, k, v))
    for k_sl, causal in pairs:
        dq_p, dk_p, dv_p = kernel.backward(do, q, k[:, :, k_sl], v[:, :, k_sl], o, lse,
                                           causal=causal, scale=SCALE)
        dq += dq_p
        dk[:, :, k_sl] += dk_p
        dv[:, :, k_sl] += dv_p
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def one_chip(q, k, v, do) -> dict[str, torch.Tensor]:
    """float64 oracle: the queries see every earlier key and their own segment causally."""
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    s, n = q.shape[2], k.shape[2]
    visible = torch.ones(s, n, dtype=torch.bool).tril(n - s)
    scores = torch.einsum("bgrqe,bgke->bgrqk", q.unflatten(1, (k.shape[1], -1)), k) * SCALE
    scores = scores.masked_fill(~visible, float("-inf")).flatten(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=SCALE, enable_gqa=True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.double())
    return {"o": o, "lse": torch.logsumexp(scores, -1), "dq": dq, "dk": dk, "dv": dv}


@pytest.mark.parametrize("seed", [0, 1])
def test_sdpa_pair_equals_tiles(seed):
    """float32: sdpa's o, log-sum-exp (natural log, [B, H, s]) and the gradients from the final
    merged (o, lse) equal the tiles' within 1e-5, and both equal a float64 one-chip oracle."""
    x = pair_inputs(seed)
    tiles, sdpa, oracle = merged_pairs("tiles", *x), merged_pairs("sdpa", *x), one_chip(*x)
    for name in NAMES:
        assert_close(f"sdpa vs tiles: {name}", tiles[name], sdpa[name], FP32_TOL)
        for kernel, got in (("tiles", tiles), ("sdpa", sdpa)):
            assert_close(f"{kernel} vs float64: {name}", oracle[name], got[name], FP32_TOL)


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_bf16_pair_against_float32(kernel):
    """bf16 q, k, v, dO run bf16 attention with float32 statistics (the merged o, lse and the
    summed gradients float32) within BF16_TOL of float32."""
    x = pair_inputs(0)
    want, got = merged_pairs("tiles", *x), merged_pairs(kernel, *x, dtype=torch.bfloat16)
    assert got["lse"].dtype == torch.float32
    for name in NAMES:
        assert_close(f"{kernel} bf16 vs float32: {name}", want[name], got[name], BF16_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sdpa_pair_on_cuda_flash(dtype):
    """CUDA's flash op (the one device path not run on CPU): the merged pairs in bf16 / fp16
    within BF16_TOL of float32 tiles on CPU, and of the tiles on CUDA in the same dtype
    (head_dim 16: a multiple of 8, as flash needs). Run by scripts/device-check.sh."""
    x = pair_inputs(0)
    resolve_torch_attention_kernel("fused", device="cuda", dtype=dtype, head_dim=16)
    want = merged_pairs("tiles", *x)
    got = merged_pairs("sdpa", *x, dtype=dtype, device="cuda")
    tiles = merged_pairs("tiles", *x, dtype=dtype, device="cuda")
    for name in NAMES:
        assert_close(f"cuda sdpa {dtype} vs float32: {name}", want[name], got[name].cpu(),
                     BF16_TOL)
        assert_close(f"cuda sdpa vs tiles {dtype}: {name}", tiles[name].cpu(), got[name].cpu(),
                     BF16_TOL)


def test_sdpa_kernel_returns_the_ops_layout_and_dtypes():
    """One pair: o in q's dtype [B, H, s, E]; lse float32 [B, H, s]; gradients shaped like
    q, k, v (GQA: k, v keep G heads) in q's dtype."""
    q, k, v, do = (x.to(torch.bfloat16) for x in pair_inputs(0, s=8, s_before=0))
    o, lse = SdpaKernel().forward(q, k, v, causal=True, scale=SCALE)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == (q.shape, torch.bfloat16, q.shape[:3],
                                                         torch.float32)
    grads = SdpaKernel().backward(do, q, k, v, o.float(), lse, causal=True, scale=SCALE)
    assert [(g.shape, g.dtype) for g in grads] == [(x.shape, torch.bfloat16) for x in (q, k, v)]


def test_kernel_names_are_checked():
    assert isinstance(attention_kernel("tiles", block=3), TilesKernel)
    assert isinstance(attention_kernel("sdpa"), SdpaKernel)
    with pytest.raises(ValueError, match="kernel='flash' is not one of: tiles, sdpa"):
        attention_kernel("flash")
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="kernel='flash' is not one of"):
        attention_cp(q, q[:, :, :1], q[:, :, :1], group=None, mode="ring", kernel="flash")
    with pytest.raises(ValueError, match="kernels='fast' is not one of: reference, fused"):
        CPSettings(mode="p2p", chips=2, kernels="fast")


@pytest.mark.parametrize("kernels, kernel", [("reference", "tiles"), ("fused", "sdpa")])
def test_context_parallel_gives_attention_the_kernel_of_kernels(kernels, kernel):
    model = HybridLanguageModel(get_preset("tiny", layers="hybrid", num_layers=2))
    context_parallel(model, group=None,
                     cp=CPSettings(mode="p2p", chips=2, attn_cp="ring", kernels=kernels))
    layers = [m for m in model.modules() if isinstance(m, ContextParallelGatedAttention)]
    assert layers and {m.kernel for m in layers} == {kernel}


# ----------------------------------------------------------------------------- resolver

def test_resolver_names_the_kernel_with_its_version():
    # The installed distribution's version, build tag included (e.g. +cu128): the name a
    # worker's rule book (gdn_core.kernels) stores for the same point.
    version = torch.__version__
    assert attention_kernel_name("torch", "fused", device_kind="cpu", dtype="bfloat16",
                                 head_dim=256) == f"torch {version} sdpa flash (cpu)"
    assert resolve_torch_attention_kernel("reference", device="cuda", dtype="float32",
                                          head_dim=512) == "reference torch blockwise tiles"
    for dtype in ("float32", "bfloat16", torch.float16):
        assert resolve_torch_attention_kernel("fused", device="cpu", dtype=dtype,
                                              head_dim=256) == f"torch {version} sdpa flash (cpu)"
    with pytest.raises(ValueError, match="kernels='fast' is not one of"):
        resolve_torch_attention_kernel("fast", device="cpu", dtype="float32", head_dim=64)


def test_resolver_gives_the_reason_the_fused_kernel_cannot_serve():
    with pytest.raises(KernelUnavailable, match=r"sdpa flash \(cpu\) computes in .*, not "
                       r"torch.float8_e4m3fn"):
        resolve_torch_attention_kernel("fused", device="cpu", dtype=torch.float8_e4m3fn,
                                       head_dim=64)
    with pytest.raises(KernelUnavailable, match="no SDPA flash op for device type 'meta'"):
        resolve_torch_attention_kernel("fused", device="meta", dtype="bfloat16", head_dim=64)
    if not torch.cuda.is_available():
        with pytest.raises(KernelUnavailable, match="CUDA is not available"):
            resolve_torch_attention_kernel("fused", device="cuda", dtype="bfloat16",
                                           head_dim=64)
    # CUDA's flash gates, by (dtype, head_dim, compute capability)
    h100, a100, rtx4090 = (9, 0), (8, 0), (8, 9)
    assert cuda_flash_refusal(dtype=torch.bfloat16, head_dim=128, capability=h100) is None
    assert cuda_flash_refusal(dtype=torch.float16, head_dim=256, capability=a100) is None
    assert "float16 or bfloat16, not torch.float32" in cuda_flash_refusal(
        dtype=torch.float32, head_dim=128, capability=h100)
    assert "head_dim <= 256 and a multiple of 8" in cuda_flash_refusal(
        dtype=torch.bfloat16, head_dim=512, capability=h100)
    assert "got 100" in cuda_flash_refusal(dtype=torch.bfloat16, head_dim=100, capability=h100)
    assert "needs sm80 or newer; this GPU is sm75" in cuda_flash_refusal(
        dtype=torch.float16, head_dim=64, capability=(7, 5))
    assert "(192, 224] on sm89" in cuda_flash_refusal(dtype=torch.bfloat16, head_dim=200,
                                                      capability=rtx4090)
    assert cuda_flash_refusal(dtype=torch.bfloat16, head_dim=200, capability=h100) is None
    assert "no CUDA flash" in cuda_flash_refusal(dtype=torch.bfloat16, head_dim=64,
                                                 capability=h100, built=False)


# ----------------------------------------------------------------- through attention_cp

def cp_case(rank: int, D: int, mode: str, layout: str, kernel: str, dtype) -> dict:
    """One rank's o, dq, dk, dv (float32 numpy) of test_torch_cp_attention's data under
    `kernel`, with q, k, v in `dtype`."""
    x, pos = data(D), positions(rank, D, layout)
    q, k, v = (torch.tensor(x[n][:, pos]).to(dtype).requires_grad_() for n in ("q", "k", "v"))
    o = attention_cp(q, k, v, group=None, mode=mode, layout=layout, kernel=kernel, block=BLOCK)
    (o.float() * torch.tensor(x["W"][:, pos])).sum().backward()
    return {name: t.detach().float().numpy() for name, t in
            (("o", o), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))}


@contextlib.contextmanager
def kernel_calls():
    """Count the pair forwards each kernel runs inside the block: {kernel name: calls}."""
    calls = dict.fromkeys(ATTENTION_KERNELS, 0)
    originals = {cls: cls.forward for cls in (TilesKernel, SdpaKernel)}

    def counting(cls):
        def forward(self, *args, **kwargs):
            calls[cls.name] += 1
            return originals[cls](self, *args, **kwargs)
        return forward

    for cls in originals:
        cls.forward = counting(cls)
    try:
        yield calls
    finally:
        for cls, forward in originals.items():
            cls.forward = forward


def fused_training_run(D: int) -> dict:
    """run_cp_training of the tiny hybrid with CPSettings(kernels='fused'), verified against one
    chip (the reference model), and the kernel calls it made. The GDN layers' fused kernel is
    fla-core's, CUDA only: here the reference rule kernel stands in for it through the same
    composition (gdn_kernel="reference"; its calls are counted as "gdn")."""
    from gdn_core.torch_gdn.cp.train import run_cp_training
    from gdn_core.torch_gdn.gdn_kernels import ReferenceGDNKernel

    from .test_torch_cp_hybrid import model_cfg, train_cfg

    cp = CPSettings(mode="p2p", chips=D, attn_cp="ring", layout="zigzag", kernels="fused")
    gdn_call = ReferenceGDNKernel.__call__
    gdn_calls = [0]

    def counted(self, *args, **kwargs):
        gdn_calls[0] += 1
        return gdn_call(self, *args, **kwargs)

    ReferenceGDNKernel.__call__ = counted
    try:
        with kernel_calls() as calls:
            report = run_cp_training(model_cfg(D), train_cfg(D), group=None, cp=cp, steps=1,
                                     warmup_steps=0, verify=True, gdn_kernel="reference")
    finally:
        ReferenceGDNKernel.__call__ = gdn_call
    return {"max_rel_err": report.max_rel_err, "calls": dict(calls, gdn=gdn_calls[0])}


def kernel_job(rank: int, D: int) -> dict:
    """Every case of this file on one rank (run by test_torch_cp_attention.attention_job inside
    test_torch_cp_hybrid's spawned job)."""
    out = {(mode, layout, kernel, str(dtype)): cp_case(rank, D, mode, layout, kernel, dtype)
           for mode in ATTN_CP_MODES for layout in LAYOUTS for kernel in ATTENTION_KERNELS
           for dtype in (torch.float32, torch.bfloat16)}
    out["fused_run"] = fused_training_run(D)
    return out


def kernel_results(D: int) -> list[dict]:
    from .test_torch_cp_attention import results  # it imports this module's kernel_job

    return [r["kernels"] for r in results(D)]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_sdpa_equals_tiles_through_attention_cp(mode, layout, D):
    """float32: every rank's o, dq, dk, dv under sdpa equal the tiles' within 1e-5 (the tiles
    equal one chip: test_torch_cp_attention)."""
    for rank, r in enumerate(kernel_results(D)):
        tiles, sdpa = (r[(mode, layout, kernel, "torch.float32")] for kernel in ("tiles", "sdpa"))
        for name in tiles:
            assert_close(f"{mode}-{layout}-D{D} rank {rank}: {name}", tiles[name], sdpa[name],
                         FP32_TOL)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_bf16_attention_cp_against_float32(mode, D):
    """bf16 q, k, v through attention_cp, either kernel and layout: within BF16_TOL of the
    float32 tiles."""
    for rank, r in enumerate(kernel_results(D)):
        for layout in LAYOUTS:
            want = r[(mode, layout, "tiles", "torch.float32")]
            for kernel in ATTENTION_KERNELS:
                got = r[(mode, layout, kernel, "torch.bfloat16")]
                for name in want:
                    assert_close(f"{mode}-{layout}-{kernel} bf16 D{D} rank {rank}: {name}",
                                 want[name], got[name], BF16_TOL)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
def test_kernels_fused_reaches_attention_from_run_cp_training(D):
    """CPSettings(kernels='fused'): the hybrid's attention runs sdpa only (ring, zigzag: three
    visible pairs per rank at D = 2, forward, verify and step), its GDN layers the rule kernel
    through the CP composition (the reference kernel standing in for fla-core's on CPU), and
    the step equals one chip."""
    from .test_torch_cp_hybrid import TOL

    for r in kernel_results(D):
        run = r["fused_run"]
        assert run["calls"]["tiles"] == 0 and run["calls"]["sdpa"] > 0, run
        assert run["calls"]["gdn"] > 0, run
        assert run["max_rel_err"] < TOL, run

