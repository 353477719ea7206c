"""The fused JAX attention kernels lowered for their targets on this CPU: splash for TPU
(jax.export at the Qwen3.5 presets' shapes, as each attn_cp mode cuts them), its block rule
(TPU's (8, 128) tiling: which check catches a bad block), and the cuDNN primitives for CUDA
(the bind's operands and parameters against the installed jax's, and the lowering that
jax_gdn.kernels runs before a GPU step is built).

Nothing runs: jax.export / lowering only, so these hold on a host without TPU or GPU.
Legend: B batch, s segment tokens, T tokens, D chips, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import pytest

from gdn_core.cp_modes import UlyssesHeads
from gdn_core.jax_gdn import attention_fused
from gdn_core.jax_gdn.attention_fused import (CUDNN_BACKWARD_PARAMS, CUDNN_FORWARD_PARAMS,
                                              CUDNN_UNUSED_OPERANDS, cudnn_bind_backward,
                                              cudnn_bind_forward, lower_cudnn_pair,
                                              splash_block, splash_kernel)
from gdn_core.jax_gdn.cp.attention import segment_table
from gdn_core.jax_gdn.kernels import cudnn_lowering_problem, resolve_jax_attention_kernel
from gdn_core.kernels import KernelUnavailable
from gdn_core.presets import get_preset

SEQ_LEN, CHIPS = 16_384, 8
PRESETS = ("qwen3.5-27b", "qwen3-next-80b-a3b")  # 24 : 4 and 16 : 2 heads, head_dim 256


def pair_shape(preset: str, attn_cp: str, layout: str) -> tuple[int, int, int, int]:
    """(s, H, G, E) of the segment pairs attn_cp runs for the preset at SEQ_LEN on CHIPS, as
    cp/step.py's mesh_cp and cp/attention.py cut them: ring and all_gather_kv a chip's
    segment at every head; ulysses the whole sequence at H/D query heads and the KV heads
    those use (UlyssesHeads)."""
    attention = get_preset(preset).attention
    H, G, E = attention.num_heads, attention.num_kv_heads, attention.head_dim
    if attn_cp == "ulysses":
        plan = UlyssesHeads(num_k_heads=G, num_v_heads=H, chips=CHIPS)
        return SEQ_LEN, H // CHIPS, plan.key_heads_per_chip, E
    return SEQ_LEN // (CHIPS * segment_table(CHIPS, layout).shape[1]), H, G, E


CASES = [(preset, attn_cp, layout) for preset in PRESETS
         for attn_cp, layout in (("ring", "contiguous"), ("all_gather_kv", "zigzag"),
                                 ("ulysses", "contiguous"))]


def export_pair(kernel, s, H, G, E, causal, dtype=jnp.bfloat16):
    """jax.export for TPU of the pair's forward and of its backward (merged o, lse fed in)."""
    q, kv = (jax.ShapeDtypeStruct((1, s, heads, E), dtype) for heads in (H, G))
    lse = jax.ShapeDtypeStruct((1, s, H), jnp.float32)
    forward = jax.export.export(jax.jit(lambda q, k, v: kernel.forward(q, k, v, causal)),
                                platforms=("tpu",))(q, kv, kv)
    backward = jax.export.export(jax.jit(lambda *a: kernel.backward(*a, causal)),
                                 platforms=("tpu",))(q, kv, kv, q, lse, q)
    return forward, backward


def mosaic_kernels(exported) -> list[str]:
    """The Pallas TPU (Mosaic) kernels an exported module calls, by name."""
    return sorted(re.findall(r'kernel_name = "(\w+)"', exported.mlir_module()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset, attn_cp, layout", CASES,
                         ids=["-".join(case) for case in CASES])
def test_splash_pairs_export_for_tpu_at_preset_shapes(preset, attn_cp, layout):
    """Full and causal pairs: forward one Mosaic kernel (o in bf16, lse float32), backward
    splash's dq and dkv kernels (float32 gradients), each for TPU."""
    s, H, G, E = pair_shape(preset, attn_cp, layout)
    assert s % 128 == 0 and E == 256
    resolve_jax_attention_kernel("fused", backend="tpu", dtype="bfloat16", head_dim=E,
                                 segment_len=s)  # the step's own check lets it through
    for causal in ([True] if attn_cp == "ulysses" else [False, True]):
        forward, backward = export_pair(splash_kernel(), s, H, G, E, causal)
        assert forward.platforms == backward.platforms == ("tpu",)
        assert mosaic_kernels(forward) == ["splash_mha_fwd_residuals"]
        assert [(a.shape, a.dtype) for a in forward.out_avals] == [
            ((1, s, H, E), jnp.bfloat16), ((1, s, H), jnp.float32)]
        assert mosaic_kernels(backward) == ["splash_mha_dkv_no_residuals",
                                            "splash_mha_dq_no_residuals"]
        assert [(a.shape, a.dtype) for a in backward.out_avals] == [
            ((1, s, H, E), jnp.float32), ((1, s, G, E), jnp.float32),
            ((1, s, G, E), jnp.float32)]


def test_interpreted_splash_calls_no_tpu_kernel():
    """interpret=True lowers to plain XLA (what a CPU runs): no Mosaic kernel in its module."""
    forward, backward = export_pair(splash_kernel(interpret=True), 128, 2, 1, 16, True,
                                    jnp.float32)
    assert mosaic_kernels(forward) == mosaic_kernels(backward) == []
    assert "tpu_custom_call" not in forward.mlir_module()


# ---- TPU's (8, 128) block rule --------------------------------------------------------------

def test_splash_blocks_keep_the_tpu_tiling_rule_for_every_served_segment():
    for s in range(128, 16_385, 128):
        block = splash_block(s)
        assert block % 128 == 0 and s % block == 0 and block <= attention_fused.SPLASH_BLOCK


@pytest.mark.parametrize("s", [64, 192, 200])
def test_a_segment_that_would_break_the_tiling_rule_is_refused_by_us(s):
    """No splash block fits a segment that is no multiple of 128: our check refuses it
    (KernelUnavailable, before a step is built and before splash or the export would see a
    block), from the resolver and from the kernel alike."""
    with pytest.raises(KernelUnavailable, match=rf"multiple of 128 tokens .*segment_len={s}"):
        resolve_jax_attention_kernel("fused", backend="tpu", dtype="bfloat16", head_dim=256,
                                     segment_len=s)
    with pytest.raises(KernelUnavailable, match=rf"segment_len={s}"):
        export_pair(splash_kernel(), s, 2, 1, 256, True)


def test_the_export_itself_rejects_a_block_breaking_the_tiling_rule():
    """What makes the exports above a check: a splash kernel built with 4-row query blocks
    (not a multiple of 8, nor the whole sequence) fails in jax.export's TPU lowering."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    s, H, E = 256, 2, 128
    with jax.ensure_compile_time_eval():
        kernel = splash.make_splash_mha(
            splash.MultiHeadMask([splash.CausalMask((s, s))] * H), head_shards=1,
            q_seq_shards=1, block_sizes=splash.BlockSizes(
                block_q=4, block_kv=128, block_kv_compute=128, block_q_dkv=128,
                block_kv_dkv=128, block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128))
    q = jax.ShapeDtypeStruct((H, s, E), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"divisible by 8 and 128"):
        jax.export.export(jax.jit(kernel), platforms=("tpu",))(q, q, q)


# ---- cuDNN: the private primitives this project binds ---------------------------------------

def _cudnn():
    from jax._src.cudnn import fused_attention_stablehlo

    return fused_attention_stablehlo


def test_cudnn_bind_matches_the_installed_primitives():
    """The operands and parameters attention_fused binds are those the installed jax's
    primitives are evaluated with (their abstract evaluation's signature), and binding them
    traces to the two primitives with exactly those parameters."""
    cudnn = _cudnn()
    for rule, extra, params in (
            (cudnn._dot_product_attention_fwd_abstract, (), CUDNN_FORWARD_PARAMS),
            (cudnn._dot_product_attention_bwd_abstract,
             ("activation", "fwd_output", "grad_output"), CUDNN_BACKWARD_PARAMS)):
        signature = inspect.signature(rule).parameters.values()
        assert [p.name for p in signature if p.kind == p.POSITIONAL_OR_KEYWORD] == [
            "query", "key", "value", *CUDNN_UNUSED_OPERANDS, *extra]
        assert {p.name for p in signature if p.kind == p.KEYWORD_ONLY} == set(params)
    q, kv = (jax.ShapeDtypeStruct((1, 128, heads, 64), jnp.bfloat16) for heads in (2, 1))
    lse = jax.ShapeDtypeStruct((1, 128, 2), jnp.float32)
    fwd = jax.make_jaxpr(lambda *a: cudnn_bind_forward(*a, True))(q, kv, kv).eqns
    bwd = jax.make_jaxpr(lambda *a: cudnn_bind_backward(*a, True))(q, kv, kv, q, lse, q).eqns
    bound = {e.primitive: e.params for e in fwd + bwd if "dot_product_attention" in str(
        e.primitive)}
    assert {p: set(params) for p, params in bound.items()} == {
        cudnn._dot_product_attention_fwd_p_wrapper: set(CUDNN_FORWARD_PARAMS),
        cudnn._dot_product_attention_bwd_p_wrapper: set(CUDNN_BACKWARD_PARAMS)}


@pytest.mark.parametrize("preset", PRESETS)
def test_cudnn_pair_lowers_for_cuda_at_preset_shapes(preset):
    """One causal pair's forward and backward primitives lower for CUDA here (no cuDNN needed
    to lower) to cuDNN's fused attention custom calls, at a ring segment of the preset."""
    s, H, G, E = pair_shape(preset, "ring", "contiguous")
    text = lower_cudnn_pair("cuda", s=s, H=H, G=G, E=E).as_text()
    assert sorted(set(re.findall(r"custom_call @([\w$]+)", text))) == [
        "__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    assert cudnn_lowering_problem() is None


@pytest.fixture
def fresh_cudnn_check():
    cudnn_lowering_problem.cache_clear()
    yield
    cudnn_lowering_problem.cache_clear()


def test_a_bind_the_installed_jax_no_longer_takes_makes_cudnn_unavailable(
        monkeypatch, fresh_cudnn_check):
    """A parameter renamed (as a jax release might rename it): the availability check lowers
    the bind, fails, and the GPU's fused attention is refused with jax's error, where a name
    lookup alone would have passed."""
    call = attention_fused._cudnn_call

    def renamed(q, causal):
        cudnn, unused, params = call(q, causal)
        params["sliding_window"] = params.pop("sliding_window_length")
        return cudnn, unused, params

    monkeypatch.setattr(attention_fused, "_cudnn_call", renamed)
    with pytest.raises(KernelUnavailable, match=r"cuDNN attention primitives do not take what "
                       r"attention_fused.py binds .*TypeError.*sliding_window"):
        resolve_jax_attention_kernel("fused", backend="gpu", dtype="bfloat16", head_dim=256)
