"""JAX attention kernels (jax_gdn.attention_pairs, attention_fused, kernels): the fused segment
pair against the reference pair, the fused CP attention against the one-chip attention for
every attn_cp × layout (outputs and gradients, float32 within 1e-5), bf16 against float32, why
the merge needs its own VJP (jax's residual has no gradient, and is rounded under bf16), the
resolvers' names and reasons, and the kernel choice reaching the step's attention.

Inputs are realistic: the keys of a head share a direction (cosine ≈ 0.8 between them), so
softmax rows are peaked as a trained model's, not near-uniform as i.i.d. keys give.
Legend: B batch, s segment tokens, T tokens, D chips, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gdn_core.config import AttentionConfig, GDNConfig, ModelConfig
from gdn_core.cp_layout import LAYOUTS, shard_order
from gdn_core.cp_modes import ATTN_CP_MODES, CPSettings
from gdn_core.interpreted_kernels import INTERPRET_ENV
from gdn_core.jax_gdn.attention import causal_attention
from gdn_core.jax_gdn.cp.attention import attention_cp
from gdn_core.jax_gdn.cp.step import mesh_cp, model_hooks, synthetic_batch
from gdn_core.jax_gdn.cp.verify import cp_loss_and_grads_fn
from gdn_core.jax_gdn.kernels import (
    REFERENCE_ATTENTION,
    REFERENCE_GDN,
    pair_kernel,
    resolve_jax_attention_kernel,
    resolve_jax_gdn_kernel,
    resolve_jax_kernels,
)
from gdn_core.jax_gdn.model import model_loss
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.kernels import KernelUnavailable, resolve_kernels
from gdn_core.testing import assert_close, max_verify_error, rel_err
from gdn_core.train_config import TrainConfig

TOL = 1e-5
BF16_TOL = 1e-2
"""bf16 against float32 on the same (bf16-representable) inputs: bf16 keeps 8 significant bits,
so q·k, p·v and o each round by up to 2^-9 ≈ 2e-3 relative; seen 2–5e-3 here. A merge by
bf16 log-sum-exp (jax's own residual) adds up to ~3e-2 at lse ≈ 10, which this would catch."""
REFERENCE_BLOCK = 8  # reference tiles of 8 tokens: several per segment, the diagonal masked


@pytest.fixture(autouse=True)
def compiled_kernels(monkeypatch):
    """These tests name the CPU's fused attention XLA's: without the interpreter switch
    (test_jax_splash_interpreted.py covers it), whatever the caller's environment says, but
    where a test sets it (a fused CPU step runs only under it: the Pallas GDN rule)."""
    monkeypatch.delenv(INTERPRET_ENV, raising=False)


def shared_direction_inputs(B, T, H, G, E, seed=0, cosine=0.8):
    """q, k, v and an output weight w [B, T, heads, E], float32; every key of a head is
    cosine·(a common direction) + noise, at the norm √E."""
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal((G, E))
    direction *= np.sqrt(E) / np.linalg.norm(direction, axis=-1, keepdims=True)
    noise = np.sqrt(1 - cosine ** 2) * rng.standard_normal((B, T, G, E))
    k = cosine * direction + noise
    q = rng.standard_normal((B, T, H, E))
    v, w = rng.standard_normal((B, T, G, E)), rng.standard_normal((B, T, H, E))
    return [x.astype(np.float32) for x in (q, k, v, w)]


def as_bf16(x):
    return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))


# ---- the pair op, one device ---------------------------------------------------------------

@functools.cache
def pair_results():
    """Reference and xla pairs (s 32, H 4, G 2, E 16), full and causal: forward (o, lse) and
    backward fed the reference forward's o and lse; one compiled program."""
    q, k, v, do = shared_direction_inputs(2, 32, 4, 2, 16)

    def run(q, k, v, do):
        out = {}
        for causal in (False, True):
            o, lse = pair_kernel("reference", REFERENCE_BLOCK).forward(q, k, v, causal)
            for name in ("reference", "xla"):
                kernel = pair_kernel(name, REFERENCE_BLOCK)
                out[name, causal] = (kernel.forward(q, k, v, causal),
                                     kernel.backward(q, k, v, o, lse, do, causal))
        return out

    return jax.jit(run).lower(q, k, v, do).compile()(q, k, v, do)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_pair_equals_reference_pair(causal):
    results = pair_results()
    (ref_fwd, ref_bwd), (xla_fwd, xla_bwd) = results["reference", causal], results["xla", causal]
    assert xla_fwd[1].dtype == jnp.float32
    for name, ref, got in zip(("o", "lse", "dq", "dk", "dv"), (*ref_fwd, *ref_bwd),
                              (*xla_fwd, *xla_bwd)):
        assert_close(f"causal={causal} {name}", ref, got, TOL)


@pytest.mark.timeout(120)
def test_jax_residual_has_no_gradient_and_rounds_under_bf16():
    """Why the CP merge has its own VJP and why the fused pair recomputes lse under bf16:
    jax.nn.dot_product_attention's residual is under stop_gradient, and in the input dtype.
    The fused pair's lse is float32 and equals the reference's (bf16 products, f32 sums)."""
    q, k, v, _ = shared_direction_inputs(1, 32, 4, 2, 16)

    def residual(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla",
                                            return_residual=True)[1]

    def run(q, k, v):
        q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (q, k, v))
        return (jax.grad(lambda q: residual(q, k, v).sum())(q), residual(q16, k16, v16),
                pair_kernel("reference", REFERENCE_BLOCK).forward(q16, k16, v16, True)[1],
                pair_kernel("xla").forward(q16, k16, v16, True)[1])

    grad, jax_lse, ref_lse, fused_lse = jax.jit(run).lower(q, k, v).compile()(q, k, v)
    assert not np.any(grad)
    assert jax_lse.dtype == jnp.bfloat16 and fused_lse.dtype == jnp.float32
    assert rel_err(ref_lse, jax_lse) > 1e-4
    assert_close("bf16 fused lse", ref_lse, fused_lse, TOL)


# ---- through the CP attention at 2 virtual chips ---------------------------------------------

B, T, H, G, E, D = 2, 64, 4, 2, 16, 2
DEFAULT_CASES = [("all_gather_kv", "contiguous"), ("ring", "zigzag"), ("ulysses", "zigzag")]
"""Every attn_cp at D = 2 in the default tier (zigzag where it permutes or pairs most); the
other layouts under slow."""
SLOW_CASES = [(mode, layout) for mode in ATTN_CP_MODES for layout in LAYOUTS
              if (mode, layout) not in DEFAULT_CASES]


def cp_attention(mode, layout, kernel):
    attend = functools.partial(attention_cp, axis="cp", mode=mode, layout=layout,
                               block=REFERENCE_BLOCK, kernel=kernel)
    return jax.shard_map(attend, mesh=Mesh(np.array(jax.devices()[:D]), ("cp",)),
                         in_specs=(P(None, "cp"),) * 3, out_specs=P(None, "cp"),
                         check_vma=False)


def forward_and_grads(attend, w):
    """(o, ∂/∂q, k, v of Σ o·w summed in float32) of attend at (q, k, v)."""
    def loss(q, k, v):
        return jnp.sum((attend(q, k, v) * w.astype(q.dtype)).astype(jnp.float32))

    return lambda q, k, v: (attend(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v))


@functools.cache
def one_chip(dtype_name):
    """The one-chip attention's o and gradients on the (bf16-rounded for bfloat16) inputs,
    float32, sequence order."""
    q, k, v, w = shared_direction_inputs(B, T, H, G, E)
    if dtype_name == "bfloat16":
        q, k, v = (as_bf16(x) for x in (q, k, v))
    return jax.jit(forward_and_grads(causal_attention, w))(q, k, v)


@functools.cache
def cp_results(cases, dtype_name):
    """{(mode, layout, kernel): (o, grads)} in sequence order, one compiled program."""
    q, k, v, w = shared_direction_inputs(B, T, H, G, E)
    dtype = jnp.dtype(dtype_name)

    def run(q, k, v, w):
        out = {}
        for mode, layout, kernel in cases:
            order = shard_order(chips=D, seq_len=T, layout=layout)
            args = [x[:, order].astype(dtype) for x in (q, k, v)]
            o, grads = forward_and_grads(cp_attention(mode, layout, kernel), w[:, order])(*args)
            undo = np.argsort(order)
            out[mode, layout, kernel] = (o[:, undo], tuple(g[:, undo] for g in grads))
        return out

    return jax.jit(run).lower(q, k, v, w).compile()(q, k, v, w)


def check_against_one_chip(cases, dtype_name, tol):
    ref_o, ref_grads = one_chip(dtype_name)
    for key, (o, grads) in cp_results(tuple(cases), dtype_name).items():
        name = "/".join(key) + f" {dtype_name}"
        assert o.dtype == jnp.dtype(dtype_name), (name, o.dtype)
        assert_close(f"{name} o", ref_o, o, tol)
        for g_name, ref, got in zip("qkv", ref_grads, grads):
            assert_close(f"{name} d{g_name}", ref, got, tol)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode, layout", DEFAULT_CASES, ids=["-".join(c) for c in DEFAULT_CASES])
def test_fused_cp_attention_equals_one_chip_on_2_chips(mode, layout):
    """B 2, T 64, H 4 : G 2, E 16; o and ∂/∂q, k, v of Σ o·w, float32, within 1e-5."""
    check_against_one_chip([(mode, layout, "xla")], "float32", TOL)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fused_cp_attention_other_layouts_equal_one_chip_on_2_chips():
    check_against_one_chip([(*case, "xla") for case in SLOW_CASES], "float32", TOL)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kernel", ["reference", "xla"])
def test_bf16_cp_attention_is_within_bf16_rounding_of_float32(kernel):
    """ring/zigzag at D = 2 (four pairs a round) in bf16 against the float32 one-chip
    attention on the same bf16-rounded inputs: outputs in bf16, within BF16_TOL."""
    check_against_one_chip([("ring", "zigzag", kernel)], "bfloat16", BF16_TOL)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bf16_every_mode_and_layout_within_bf16_rounding():
    cases = [(mode, layout, kernel) for mode in ATTN_CP_MODES for layout in LAYOUTS
             for kernel in ("reference", "xla") if (mode, layout) != ("ring", "zigzag")]
    check_against_one_chip(cases, "bfloat16", BF16_TOL)


# ---- resolvers and the step's plumbing ---------------------------------------------------------

VERSION = f"jax {jax.__version__}"


def test_resolvers_name_each_kernel_with_its_version():
    resolve = functools.partial(resolve_jax_attention_kernel, head_dim=256)
    assert resolve("reference", backend="gpu", dtype="float32") == REFERENCE_ATTENTION
    assert resolve("fused", backend="cpu", dtype="float32") == (
        f"{VERSION} dot_product_attention xla")
    assert resolve("fused", backend="gpu", dtype="bfloat16") == (
        f"{VERSION} dot_product_attention cudnn")
    assert resolve("fused", backend="tpu", dtype="bfloat16", segment_len=1024) == (
        f"{VERSION} splash attention")
    # JAX's fused GDN is the Pallas chunk rule (test_jax_pallas_kernels.py: every backend).
    assert resolve_jax_gdn_kernel("reference", backend="gpu") == REFERENCE_GDN
    assert resolve_jax_gdn_kernel("fused", backend="gpu") == "gdn_core pallas chunk rule (gpu)"
    # The rule book a worker consults before building anything names the same kernels (on a
    # CPU without the interpreter switch both refuse: the Pallas rule needs a chip).
    for backend, kind, dtype in (("gpu", "gpu", "bfloat16"), ("tpu", "tpu", "bfloat16")):
        assert resolve_kernels("jax", "fused", device_kind=kind, dtype=dtype, head_dim=256,
                               has_attention=True) == resolve_jax_kernels(
            "fused", backend=backend, dtype=dtype, head_dim=256, segment_len=1024)


@pytest.mark.parametrize("backend, dtype, head_dim, segment_len, reason", [
    ("gpu", "float32", 128, None, r"bfloat16 or float16, got dtype='float32'"),
    ("gpu", "bfloat16", 12, None, r"multiple of 8 and <= 256, got head_dim=12"),
    ("gpu", "float16", 512, None, r"multiple of 8 and <= 256, got head_dim=512"),
    ("tpu", "bfloat16", 64, 1024, r"head_dim a multiple of 128 .*got head_dim=64"),
    ("tpu", "bfloat16", 128, 200, r"segments of a multiple of 128 tokens .*segment_len=200"),
    ("metal", "float32", 64, None, r"no fused JAX attention for backend 'metal'"),
], ids=["cudnn-fp32", "cudnn-E12", "cudnn-E512", "splash-E64", "splash-s200", "metal"])
def test_fused_attention_refuses_with_the_reason(backend, dtype, head_dim, segment_len, reason):
    with pytest.raises(KernelUnavailable, match=reason):
        resolve_jax_attention_kernel("fused", backend=backend, dtype=dtype, head_dim=head_dim,
                                     segment_len=segment_len)


def test_unknown_kernels_are_refused():
    with pytest.raises(ValueError, match=r"kernels='turbo' is not one of: reference, fused"):
        resolve_jax_attention_kernel("turbo", backend="cpu", dtype="float32", head_dim=64)
    with pytest.raises(ValueError, match=r"kernel='cudnn2' is not one of"):
        pair_kernel("cudnn2")


HYBRID = ModelConfig(
    name="kernels-test",
    gdn=GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8,
                  conv_kernel_size=4, chunk_size=16),
    num_layers=2, intermediate_size=64, vocab_size=64, layers="hybrid",
    attention=AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10_000.0,
                              partial_rotary_factor=0.5, full_attention_interval=2))


@pytest.mark.parametrize("kernels, pair, attention, gdn", [
    ("reference", "reference", REFERENCE_ATTENTION, REFERENCE_GDN),
    ("fused", "splash_interpreted", f"{VERSION} splash attention (interpreted)",
     "gdn_core pallas chunk rule (interpreted)")])
def test_the_kernel_choice_reaches_the_steps_layers(monkeypatch, kernels, pair, attention, gdn):
    """mesh_cp resolves `kernels` on the mesh's backend (CPU here: fused runs only under the
    interpreter switch, the Pallas GDN rule needing a chip) and the step's attend_fn and GDN
    layer run those kernels (nothing compiled; 512 tokens: splash's 128-token segments)."""
    monkeypatch.setenv(INTERPRET_ENV, "1")
    cp = mesh_cp(HYBRID, 512, mesh=Mesh(np.array(jax.devices()[:2]), ("cp",)), axis="cp",
                 cp=CPSettings(mode="p2p", chips=2, attn_cp="ring", layout="zigzag",
                               kernels=kernels))
    assert (cp.attention_kernel, cp.resolved.attention, cp.resolved.gdn) == (
        pair, attention, gdn)
    hooks = model_hooks(cp, 512)
    assert hooks["attend_fn"].keywords["kernel"] == pair
    rule_kernel = hooks["gdn_layer_fn"].keywords["rule_kernel"]
    assert (rule_kernel is None) == (kernels == "reference")
    if rule_kernel is not None:
        assert rule_kernel.keywords == {"platform": None, "interpret": True}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_fused_hybrid_loss_and_grads_equal_one_chip(monkeypatch):
    """The hybrid decoder's CP loss and gradients with kernels="fused" (p2p GDN through the
    Pallas rule, ring/zigzag attention through splash's pairs, both interpreted: on a CPU
    fused runs only so; D = 2, 128-token segments) against one chip's reference, within 1e-4
    as the hybrid CP tests hold the reference kernels (max_verify_error)."""
    monkeypatch.setenv(INTERPRET_ENV, "1")
    seq_len = 512
    train_cfg = TrainConfig(batch_size=2, seq_len=seq_len, seed=3)
    params = init_model_params(HYBRID, jax.random.PRNGKey(train_cfg.seed))
    tokens_BT1 = synthetic_batch(HYBRID, train_cfg)
    inputs_BT, targets_BT = tokens_BT1[:, :-1], tokens_BT1[:, 1:]
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(
        lambda p: model_loss(p, inputs_BT, targets_BT, HYBRID, global_tokens=2 * seq_len)))(params)
    mesh = Mesh(np.array(jax.devices()[:2]), ("cp",))
    fn = cp_loss_and_grads_fn(HYBRID, train_cfg, mesh=mesh, axis="cp",
                              cp=CPSettings(mode="p2p", chips=mesh.devices.size, attn_cp="ring",
                                            layout="zigzag", kernels="fused"))
    order = shard_order(chips=2, seq_len=seq_len, layout="zigzag")
    seq = NamedSharding(mesh, P(None, "cp"))
    args = (jax.device_put(params, NamedSharding(mesh, P())),
            jax.device_put(inputs_BT[:, order], seq), jax.device_put(targets_BT[:, order], seq))
    loss, grads = jax.jit(fn).lower(*args).compile()(*args)
    error = max_verify_error(ref_loss, loss, jax.tree.leaves(ref_grads),
                             jax.tree.leaves(jax.device_get(grads)))
    assert error <= 1e-4, f"max relative error {error:.2e}"
