"""The Pallas chunk rule lowered for its targets on this CPU: jax.export of the forward and of
the backward for ("tpu",) (Mosaic) and ("cuda",) (Triton) at Qwen3.5 presets' GDN shapes
(Dk = Dv = 128, T 8192, bf16), and TPU's (8, 128) block rule: our check names a bad block
before Mosaic would, and Mosaic's lowering rejects the same block when ours is skipped.

Nothing runs: lowering only (Pallas → Mosaic / Triton IR). Mosaic's and Triton's own compilers
run on the chip, so a lowering that passes here can still fail there (vector layouts on TPU,
registers or shared memory on GPU): the device check runs it.
Legend: B batch, T tokens, Hk/Hv key/value heads, K/V head dims, C chunk, N chunks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from gdn_core.jax_gdn.pallas.blocks import BlockPlan, block_plan, check_tpu_tiling
from gdn_core.jax_gdn.pallas.chunk_kernels import forward_call
from gdn_core.jax_gdn.pallas.chunk_rule import chunk_gated_delta_rule_pallas
from gdn_core.presets import get_preset

SEQ_LEN = 8192
PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b")  # GDN heads 16 : 16 and 16 : 32, K = V = 128
TRITON_CALL = "__gpu$xla.gpu.triton"
EXPORT_PLATFORM = {"tpu": "tpu", "gpu": "cuda"}


def preset_args(preset: str, T: int = SEQ_LEN, dtype=jnp.bfloat16):
    gdn = get_preset(preset).gdn
    B, Hk, Hv, K, V = 1, gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
    s = jax.ShapeDtypeStruct
    return (s((B, T, Hk, K), dtype), s((B, T, Hk, K), dtype), s((B, T, Hv, V), dtype),
            s((B, T, Hv), jnp.float32), s((B, T, Hv), dtype), s((B, Hv, K, V), jnp.float32))


def export(fn, platform: str, args):
    return jax.export.export(
        jax.jit(fn), platforms=(EXPORT_PLATFORM[platform],),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)])(*args)


def rule_on(platform: str):
    def forward(q, k, v, g, beta, h0):
        return chunk_gated_delta_rule_pallas(q, k, v, g, beta, initial_state=h0,
                                             output_final_state=True, use_qk_l2norm=True,
                                             platform=platform)

    def forward_backward(q, k, v, g, beta, h0):
        outputs, vjp = jax.vjp(forward, q, k, v, g, beta, h0)
        return vjp(outputs)

    return forward, forward_backward


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["tpu", "gpu"])
@pytest.mark.parametrize("preset", PRESETS)
def test_forward_and_backward_export(preset, platform):
    forward, forward_backward = rule_on(platform)
    args = preset_args(preset)
    marker = "tpu_custom_call" if platform == "tpu" else TRITON_CALL
    for name, fn, kernels in (("forward", forward, 1), ("backward", forward_backward, 2)):
        exported = export(fn, platform, args)
        assert exported.platforms == (EXPORT_PLATFORM[platform],)
        text = exported.mlir_module()
        assert text.count(marker) >= kernels, f"{name}: {text.count(marker)} {marker} calls"
        assert [o.shape for o in exported.out_avals[:2]] == (
            [a.shape for a in args[:2]] if name == "backward"
            else [args[2].shape, args[5].shape])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_packed_documents_export(platform):
    """The document path (segment rows as a further kernel input) lowers too."""
    def forward_backward(q, k, v, g, beta, h0):
        def forward(q, k, v, g, beta, h0):
            return chunk_gated_delta_rule_pallas(
                q, k, v, g, beta, initial_state=h0, output_final_state=True,
                cu_seqlens=jnp.array([0, 1000, 5000, SEQ_LEN]), platform=platform)
        outputs, vjp = jax.vjp(forward, q, k, v, g, beta, h0)
        return vjp(outputs)

    export(forward_backward, platform, preset_args("qwen3.5-4b"))


def test_the_platform_plans_keep_the_chunk_at_64():
    assert block_plan("tpu").chunk == block_plan("gpu").chunk == 64
    assert block_plan("gpu").num_warps is not None


def test_tpu_tiling_check_names_the_bad_block():
    check_tpu_tiling({"q": ((None, None, 64, 128), (1, 16, 8192, 128)),
                      "G": ((None, None, None, 1, 64), (1, 16, 128, 1, 64))})
    with pytest.raises(ValueError, match=r"q: block dim -2 is 4: neither a multiple of 8"):
        check_tpu_tiling({"q": ((None, None, 4, 128), (1, 16, 8192, 128))})
    with pytest.raises(ValueError, match=r"block dim -1 is 64: neither a multiple of 128"):
        check_tpu_tiling({"v": ((None, None, 8, 64), (1, 16, 8192, 256))})


def _forward_at_chunk(chunk: int, check_tiling: bool):
    B, Hk, Hv, N, K = 1, 2, 4, 8, 128
    q = jax.ShapeDtypeStruct((B, Hk, N * chunk, K), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((B, Hv, N * chunk, K), jnp.bfloat16)
    row = jax.ShapeDtypeStruct((B, Hv, N, 1, chunk), jnp.float32)
    h0 = jax.ShapeDtypeStruct((B, Hv, K, K), jnp.float32)

    def fn(q, k, v, G, beta, h0):
        return forward_call(BlockPlan(platform="tpu", chunk=chunk), q, k, v, G, beta, None, h0,
                            store_states=False, rule=dict(use_qk_l2norm=False, low=jnp.bfloat16),
                            check_tiling=check_tiling)[:2]

    return lambda: jax.export.export(jax.jit(fn), platforms=("tpu",))(q, q, v, row, row, h0)


@pytest.mark.timeout(120)
def test_a_chunk_breaking_the_tiling_rule_is_caught():
    """4-token chunks make [4, K] blocks: our check refuses them naming the block; with it
    skipped, Mosaic's lowering refuses them too (what makes the exports above a check)."""
    _forward_at_chunk(8, check_tiling=True)()  # 8 rows: allowed
    with pytest.raises(ValueError, match=r"TPU's \(8, 128\) tiling rule: .*block dim -2 is 4"):
        _forward_at_chunk(4, check_tiling=True)()
    with pytest.raises(ValueError, match=r"divisible by 8 and 128"):
        _forward_at_chunk(4, check_tiling=False)()
