"""Splash attention through Pallas's interpreter: kernels="fused" on a CPU under
GDN_SWEEP_INTERPRET_KERNELS=1 (gdn_core.interpreted_kernels).

The switch alone selects it, named "… splash attention (interpreted)"; what it refuses
(segments that are no multiple of 128 tokens, packed documents) with the reason; its pairs
against the reference pair; the CP attention modes through it against the one-chip reference
attention (outputs, merged log-sum-exp, gradients of q, k, v); and the tiny hybrid's CP
training step against kernels="reference". float32 within 1e-4.

Splash's blocks are multiples of 128 tokens, interpreted too, so the default tier's segments are
128 (contiguous, T 256 on 2 chips); zigzag and 4 chips run under slow. Inputs are realistic:
keys of a head share a direction (peaked softmax rows, as a trained model's).
Legend: B batch, s segment tokens, T tokens, D chips, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdn_core.cp_layout import shard_order
from gdn_core.cp_modes import CPSettings
from gdn_core.interpreted_kernels import INTERPRET_ENV, is_interpreted
from gdn_core.jax_gdn.attention import causal_attention
from gdn_core.jax_gdn.attention_fused import dense_log_sum_exp
from gdn_core.jax_gdn.attention_pairs import causal_pair_attention
from gdn_core.jax_gdn.cp import attention as cp_attention_module
from gdn_core.jax_gdn.cp import run_cp_training
from gdn_core.jax_gdn.cp.attention import attention_cp, segment_table
from gdn_core.jax_gdn.cp.step import mesh_cp, synthetic_batch
from gdn_core.jax_gdn.kernels import (REFERENCE_ATTENTION, attention_pair_kernel, pair_kernel,
                                      resolve_jax_attention_kernel)
from gdn_core.jax_gdn.model import model_loss
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.kernels import KernelUnavailable, attention_kernel_name, resolve_kernels
from gdn_core.presets import get_preset
from gdn_core.testing import assert_close
from gdn_core.train_config import TrainConfig

from .test_jax_attention_kernels import forward_and_grads, shared_direction_inputs

TOL = 1e-4
VERSION = f"jax {jax.__version__}"
SPLASH = f"{VERSION} splash attention (interpreted)"
TINY = get_preset("tiny", layers="hybrid")  # attention: 4 query / 2 KV heads, head_dim 16
REFERENCE_BLOCK = 32  # reference tiles of 32 tokens: several per segment, the diagonal masked


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv(INTERPRET_ENV, "1")


# ---- the switch and what it selects --------------------------------------------------------

@pytest.mark.parametrize("env", [None, "0", "1"], ids=["unset", "off", "on"])
def test_only_the_switch_selects_interpreted_splash_on_a_cpu(monkeypatch, env):
    """Unset or not "1": the CPU keeps XLA's attention; "1": splash through Pallas's
    interpreter, named "(interpreted)" by jax_gdn.kernels and by the rule book alike. GPU, TPU
    and kernels="reference" are the same either way."""
    if env is None:
        monkeypatch.delenv(INTERPRET_ENV, raising=False)
    else:
        monkeypatch.setenv(INTERPRET_ENV, env)
    on = env == "1"
    resolve = functools.partial(resolve_jax_attention_kernel, head_dim=16, segment_len=128)
    cpu = resolve("fused", backend="cpu", dtype="float32")
    assert cpu == (SPLASH if on else f"{VERSION} dot_product_attention xla")
    assert is_interpreted(cpu) == on
    assert attention_pair_kernel("fused", backend="cpu") == ("splash_interpreted" if on
                                                             else "xla")
    assert attention_kernel_name("jax", "fused", device_kind="cpu", dtype="float32",
                                 head_dim=16) == cpu
    if on:  # the whole point: without the switch the Pallas GDN rule refuses a CPU
        assert resolve_kernels("jax", "fused", device_kind="cpu", dtype="float32", head_dim=16,
                               has_attention=True).attention == cpu
    # Interpreted, any head_dim and bf16 run (no TPU lanes to fill).
    assert resolve("fused", backend="cpu", dtype="bfloat16") == cpu
    assert resolve("fused", backend="tpu", dtype="bfloat16", head_dim=256) == (
        f"{VERSION} splash attention")
    assert resolve("fused", backend="gpu", dtype="bfloat16") == (
        f"{VERSION} dot_product_attention cudnn")
    assert resolve("reference", backend="cpu", dtype="float32") == REFERENCE_ATTENTION
    assert attention_pair_kernel("fused", backend="tpu") == "splash"


def test_interpreted_splash_refuses_short_segments_and_documents(interpret):
    """Splash's blocks are multiples of 128 tokens (it raises below, interpreted too): the
    resolver and the step's validation (mesh_cp) refuse such segments by name; packed
    documents are refused by the rule book before a step is built, and by the pair while one
    is traced. Contiguous T 256 on 2 chips (segments of 128) is served."""
    with pytest.raises(KernelUnavailable, match=r"\(interpreted\): splash attention needs "
                       r"segments of a multiple of 128 tokens .*segment_len=64"):
        resolve_jax_attention_kernel("fused", backend="cpu", dtype="float32", head_dim=16,
                                     segment_len=64)
    mesh = Mesh(np.array(jax.devices()[:2]), ("cp",))
    def step(seq_len: int, layout: str):
        return mesh_cp(TINY, seq_len, mesh=mesh, axis="cp", cp=CPSettings(
            mode="p2p", chips=2, attn_cp="ring", layout=layout, kernels="fused"))

    with pytest.raises(KernelUnavailable, match=r"segment_len=64"):  # zigzag: 256 / 2 / 2
        step(256, layout="zigzag")
    cp = step(256, layout="contiguous")
    assert (cp.attention_kernel, cp.resolved.attention) == ("splash_interpreted", SPLASH)
    assert step(512, layout="zigzag").resolved.attention == SPLASH
    with pytest.raises(KernelUnavailable, match=r"splash attention as bound here takes no mask"):
        resolve_kernels("jax", "fused", device_kind="cpu", dtype="float32", head_dim=16,
                        has_attention=True, packed_documents=True)
    q, k, v, _ = shared_direction_inputs(1, 128, 4, 2, 16)
    with pytest.raises(KernelUnavailable, match=r"cannot serve packed documents"):
        jax.jit(lambda q, k, v: causal_pair_attention(
            q, k, v, pair_kernel("splash_interpreted"), jnp.array([0, 50, 128]))).lower(q, k, v)


def test_a_fused_cpu_point_without_the_switch_is_refused_for_its_gdn_rule(monkeypatch):
    """XLA's attention would serve packed documents, but the fused GDN rule (Pallas) runs on
    a CPU only under the switch, so the whole point is refused, naming it."""
    monkeypatch.delenv(INTERPRET_ENV, raising=False)
    assert attention_kernel_name("jax", "fused", device_kind="cpu", dtype="float32",
                                 head_dim=16) == f"{VERSION} dot_product_attention xla"
    with pytest.raises(KernelUnavailable, match="the Pallas chunk rule needs a TPU or GPU"):
        resolve_kernels("jax", "fused", device_kind="cpu", dtype="float32", head_dim=16,
                        has_attention=True, packed_documents=True)


# ---- one pair ------------------------------------------------------------------------------

S_PAIR = 640
"""5 blocks of 128 (splash_block: the largest multiple of 128 ≤ 512 dividing s): the causal
pair has partly masked diagonal blocks and skipped ones above."""


@functools.cache
def pair_results():
    """Reference and interpreted splash pairs (B 2, s 640, H 4 : G 2, E 16), full and causal:
    forward (o, lse) and backward fed the reference forward's o and lse."""
    q, k, v, do = shared_direction_inputs(2, S_PAIR, 4, 2, 16, seed=1)

    def run(q, k, v, do):
        out = {}
        for causal in (False, True):
            o, lse = pair_kernel("reference", REFERENCE_BLOCK).forward(q, k, v, causal)
            for name in ("reference", "splash_interpreted"):
                kernel = pair_kernel(name, REFERENCE_BLOCK)
                out[name, causal] = (kernel.forward(q, k, v, causal),
                                     kernel.backward(q, k, v, o, lse, do, causal))
        return out

    return jax.jit(run)(q, k, v, do)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_interpreted_splash_pair_equals_reference_pair(causal):
    (ref_fwd, ref_bwd) = pair_results()["reference", causal]
    (fwd, bwd) = pair_results()["splash_interpreted", causal]
    assert fwd[1].dtype == jnp.float32 and all(g.dtype == jnp.float32 for g in bwd)
    for name, ref, got in zip(("o", "lse", "dq", "dk", "dv"), (*ref_fwd, *ref_bwd),
                              (*fwd, *bwd)):
        assert_close(f"causal={causal} {name}", ref, got, TOL)


# ---- the CP attention modes on virtual chips -----------------------------------------------

B, H, G, E = 2, 4, 2, 16
MERGED_FORWARD = {"ring": cp_attention_module._ring_fwd,
                  "all_gather_kv": cp_attention_module._all_gather_kv_fwd}
"""The modes whose forward merges segment pairs: their residuals end with the merged lse
[P, B, s, H] (ulysses attends one causal pair: its lse is the pair's, checked above)."""


def merged_lse(mode, layout, D):
    """shard_mapped: this chip's merged log-sum-exp, [P, B, D·s, H] globally."""
    def lse(q, k, v):
        return MERGED_FORWARD[mode](q, k, v, None, "cp", layout, REFERENCE_BLOCK,
                                    "splash_interpreted")[1][-1]

    return jax.shard_map(lse, mesh=Mesh(np.array(jax.devices()[:D]), ("cp",)),
                         in_specs=(P(None, "cp"),) * 3, out_specs=P(None, None, "cp"),
                         check_vma=False)


def lse_in_sequence_order(lse_PBtH, D, layout):
    """[P, B, D·s, H] (chip r's segment p at [p, :, r·s:(r+1)·s]) → [B, T, H] in order."""
    table, s = segment_table(D, layout), lse_PBtH.shape[2] // D
    parts = {int(table[r, p]): lse_PBtH[p, :, r * s:(r + 1) * s]
             for r in range(D) for p in range(table.shape[1])}
    return jnp.concatenate([parts[i] for i in range(len(parts))], axis=1)


@functools.cache
def one_chip(T):
    """The one-chip reference attention's o, gradients and causal log-sum-exp."""
    q, k, v, w = shared_direction_inputs(B, T, H, G, E)
    o, grads = jax.jit(forward_and_grads(causal_attention, w))(q, k, v)
    return o, grads, dense_log_sum_exp(q, k, causal=True)


def check_cp_against_one_chip(mode, layout, D, T):
    q, k, v, w = shared_direction_inputs(B, T, H, G, E)
    order = shard_order(chips=D, seq_len=T, layout=layout)
    undo = np.argsort(order)
    attend = jax.shard_map(
        functools.partial(attention_cp, axis="cp", mode=mode, layout=layout,
                          block=REFERENCE_BLOCK, kernel="splash_interpreted"),
        mesh=Mesh(np.array(jax.devices()[:D]), ("cp",)), in_specs=(P(None, "cp"),) * 3,
        out_specs=P(None, "cp"), check_vma=False)
    args = [x[:, order] for x in (q, k, v)]
    o, grads = jax.jit(forward_and_grads(attend, w[:, order]))(*args)
    ref_o, ref_grads, ref_lse = one_chip(T)
    name = f"{mode}/{layout} D={D} T={T}"
    assert_close(f"{name} o", ref_o, o[:, undo], TOL)
    for g_name, ref, got in zip("qkv", ref_grads, grads):
        assert_close(f"{name} d{g_name}", ref, got[:, undo], TOL)
    if mode in MERGED_FORWARD:
        lse = jax.jit(merged_lse(mode, layout, D))(*args)
        assert_close(f"{name} merged lse", ref_lse, lse_in_sequence_order(lse, D, layout), TOL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["ring", "all_gather_kv", "ulysses"])
def test_interpreted_splash_cp_attention_equals_one_chip(mode):
    """D 2, contiguous, T 256 (segments of 128; ulysses: one pair of 256 at 2 heads), B 2,
    H 4 : G 2, E 16: o, merged lse and ∂/∂q, k, v of Σ o·w within 1e-4 of the reference."""
    check_cp_against_one_chip(mode, "contiguous", 2, 256)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["ring", "all_gather_kv", "ulysses"])
@pytest.mark.parametrize("layout, D", [("zigzag", 2), ("contiguous", 4), ("zigzag", 4)])
def test_interpreted_splash_cp_attention_other_layouts_and_chips(mode, layout, D):
    """Zigzag (two segments a chip, skipped / full / causal pairs) and 4 chips (ulysses
    replicates the 2 KV heads), segments of 128."""
    check_cp_against_one_chip(mode, layout, D, 128 * D * (2 if layout == "zigzag" else 1))


# ---- the training step ---------------------------------------------------------------------

TRAIN = TrainConfig(batch_size=1, seq_len=256, seed=3)


def train_tiny(kernels, *, steps, verify):
    return run_cp_training(TINY, TRAIN, mesh=Mesh(np.array(jax.devices()[:2]), ("cp",)),
                           axis="cp", steps=steps, warmup_steps=0, verify=verify,
                           cp=CPSettings(mode="p2p", chips=2, attn_cp="ring", kernels=kernels))


def one_chip_loss():
    """The tiny hybrid's loss on one chip with the reference attention, at the weights and
    tokens run_cp_training starts from (seed TRAIN.seed)."""
    params = init_model_params(TINY, jax.random.PRNGKey(TRAIN.seed))
    tokens_BT1 = synthetic_batch(TINY, TRAIN)
    return jax.jit(lambda p: model_loss(p, tokens_BT1[:, :-1], tokens_BT1[:, 1:], TINY,
                                        global_tokens=TRAIN.batch_size * TRAIN.seq_len))(params)


@pytest.mark.timeout(300)
def test_fused_training_step_interpreted_matches_reference(interpret):
    """The tiny hybrid (head_dim 16), p2p GDN with ring attention on 2 chips, T 256, float32:
    under the switch kernels="fused" runs splash interpreted (so named), and the CP training
    step's loss matches the one-chip reference model's."""
    mesh = Mesh(np.array(jax.devices()[:2]), ("cp",))
    assert mesh_cp(TINY, TRAIN.seq_len, mesh=mesh, axis="cp",
                   cp=CPSettings(mode="p2p", chips=mesh.devices.size, attn_cp="ring",
                                 kernels="fused")).resolved.attention == SPLASH
    report = train_tiny("fused", steps=1, verify=False)
    assert_close("first loss", one_chip_loss(), report.losses[0], 1e-5)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fused_training_interpreted_matches_reference_training(interpret):
    """Gradients: the fused step's against one chip's reference (verify, within 1e-4); and
    three steps each way (each after an AdamW update from the step before): the losses of
    kernels="fused" (splash interpreted) and kernels="reference" CP training agree."""
    fused = train_tiny("fused", steps=3, verify=True)
    assert fused.verified_seq_len == TRAIN.seq_len and fused.max_rel_err <= TOL
    reference = train_tiny("reference", steps=3, verify=False)
    assert_close("losses", reference.losses, fused.losses, 1e-5)
