"""JAX context-parallel rule: every mode against the single-chip rule, and its communication.

Legend: B batch, T global tokens, D chips, Hk/Hv key/value heads, Dk/Dv head dims, C chunk.
Oracle: gdn_core.jax_gdn.chunk_gated_delta_rule on the same global arrays (and the token-by-token
recurrence for the output). One jit per (mode, mesh) returns the output, the final state and
the gradients of q, k, v, g, beta and initial_state; the comm test reads the same program's HLO.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core import jax_gdn
from gdn_core.cp_modes import CP_MODES
from gdn_core.jax_gdn.cp import chunk_gated_delta_rule_cp, conv_halo
from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip
from gdn_core.testing import assert_close

from .rule_inputs import RuleCase, make_inputs

# T/D = 60, 30 (15 under slow): never a multiple of the 16-token chunk. GQA r = 2, Dk ≠ Dv.
CASE = RuleCase(1, 120, 4, 8, 16, 32, "mixed", 16)
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
STATE_BYTES = CASE.B * CASE.Hv * CASE.Dk * CASE.Dv * 4
PAIR_BYTES = CASE.B * CASE.Hv * CASE.Dk * (CASE.Dk + CASE.Dv) * 4
TOL = 1e-4
# layout → (mesh shape, mesh axis names, the `axis` argument)
LAYOUTS = {"D2": ((2,), ("cp",), "cp"), "D4": ((4,), ("cp",), "cp"),
           "2x2": ((2, 2), ("a", "b"), ("a", "b")), "2x2-ba": ((2, 2), ("a", "b"), ("b", "a")),
           "D8": ((8,), ("cp",), "cp")}
# Every mode at D = 2, and log_scan's two rounds over a 2-D mesh with its axes reversed; the
# 4- and 8-chip cases are the slow tier's.
CASES = [("ulysses", "D2"), ("p2p", "D2"), ("all_gather", "D2"), ("log_scan", "D2"),
         ("log_scan", "2x2-ba")]
SLOW_CASES = [pytest.param(m, layout, marks=pytest.mark.slow) for m, layout in (
    ("ulysses", "D4"), ("p2p", "2x2"), ("all_gather", "2x2"), ("log_scan", "2x2"),
    ("p2p", "D8"), ("all_gather", "D8"), ("log_scan", "D8"))]
# ulysses with fewer key heads than chips (key heads copied), and with Hk, D coprime.
GQA_CASES = [("D2", dataclasses.replace(CASE, Hk=1, Hv=4)),
             pytest.param("D4", dataclasses.replace(CASE, Hk=2, Hv=4), marks=pytest.mark.slow),
             pytest.param("D4", dataclasses.replace(CASE, Hk=3, Hv=12), marks=pytest.mark.slow),
             pytest.param("D8", dataclasses.replace(CASE, Hk=2, Hv=8), marks=pytest.mark.slow)]


def mesh_of(layout):
    shape, names, axis = LAYOUTS[layout]
    devices = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    return Mesh(devices, names), axis, math.prod(shape)


@functools.cache
def inputs(dtype=jnp.float32, case=CASE):
    x = make_inputs(case)
    x["g"][:, 5::7, 1] = -20.0  # strong decay on some tokens, including near shard edges
    x["g"][:, 59:62, 3] = -20.0
    rng = np.random.default_rng(1)  # loss weights so every output element reaches the loss
    w = (rng.standard_normal((case.B, case.T, case.Hv, case.Dv)).astype(np.float32),
         rng.standard_normal((case.B, case.Hv, case.Dk, case.Dv)).astype(np.float32))
    args = [jnp.asarray(x[n], jnp.float32 if n == "initial_state" else dtype) for n in NAMES]
    return args, tuple(jnp.asarray(a) for a in w)


def output_and_grads(rule, case=CASE):
    """Compile once; return (compiled, o, final_state, grads of q, k, v, g, beta, h0)."""
    args, (w_o, w_h) = inputs(case=case)

    def loss(q, k, v, g, beta, h0):
        o, h = rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                    use_qk_l2norm=True, chunk_size=CASE.chunk_size)
        return jnp.sum(o * w_o) + jnp.sum(h * w_h), (o, h)

    compiled = jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True)).lower(
        *args).compile()
    grads, (o, h) = compiled(*args)
    return compiled, o, h, grads


@functools.cache
def single_chip(case=CASE):
    return output_and_grads(jax_gdn.chunk_gated_delta_rule, case)[1:]


@functools.cache
def recurrence(case=CASE):
    args, _ = inputs(case=case)
    return jax.jit(lambda *a: jax_gdn.recurrent_gated_delta_rule(
        *a[:5], initial_state=a[5], use_qk_l2norm=True))(*args)[0]


@functools.cache
def cp_run(mode, layout, case=CASE):
    mesh, axis, _ = mesh_of(layout)
    rule = functools.partial(chunk_gated_delta_rule_cp, mesh=mesh, axis=axis, mode=mode)
    return output_and_grads(rule, case)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,layout", CASES + SLOW_CASES)
def test_cp_matches_single_chip(mode, layout):
    _, o, h, grads = cp_run(mode, layout)
    o_ref, h_ref, grads_ref = single_chip()
    assert_close("o", o_ref, o, TOL)
    assert_close("final_state", h_ref, h, TOL)
    for name, ref, got in zip(NAMES, grads_ref, grads):
        assert_close(f"d{name}", ref, got, TOL)
    assert_close("o vs recurrence", recurrence(), o, TOL)


def expected_received_bytes(mode, D, T_local, case=CASE):
    """Per chip, fwd + bwd of the test program, by the docs/architecture.md table plus the state
    extras of this program: with initial_state and output_final_state the sequence-sharded
    modes also all-reduce the final state (forward) and ∂L/∂h0 (backward); ulysses all-reduces
    the final state (each chip's heads, zero-padded: a transpose right with or without
    shard_map's check_vma) and ∂L/∂h0. All-reduce = ring, 2(D−1)/D of the size.
    """
    state = case.B * case.Hv * case.Dk * case.Dv * 4
    ring = 2 * (D - 1) * state // D
    shifts = [2 ** r for r in range(math.ceil(math.log2(D)))]
    if mode == "ulysses":
        # From each of the D − 1 others: q, k of the G key heads this chip's value heads use
        # (copies when Hk < D), v, g, beta of its Hv/D value heads, o back; × 2 for backward.
        Hk, Hv = case.Hk, case.Hv
        G = Hk // D if Hk % D == 0 else 1 if D % Hk == 0 else Hv // D
        channels = 2 * G * case.Dk + (Hv // D) * (2 * case.Dv + 2)
        tokens = 2 * (D - 1) * case.B * T_local * channels * 4
        return [tokens + 2 * ring] * D
    per_chip = {
        "p2p": lambda j: STATE_BYTES * ((j >= 1) + (j <= D - 2)),
        "all_gather": lambda j: 2 * (D - 1) * PAIR_BYTES,
        # backward: the last round's A part is unused (λ = E applied to 0), so XLA drops it
        "log_scan": lambda j: sum(PAIR_BYTES * (j >= d) + (j + d < D) * (
            STATE_BYTES if d == shifts[-1] else PAIR_BYTES) for d in shifts),
    }[mode]
    return [per_chip(j) + 2 * ring for j in range(D)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,layout", CASES)
def test_cp_comm_matches_table(mode, layout):
    compiled = cp_run(mode, layout)[0]
    _, _, D = mesh_of(layout)
    comm = received_bytes_per_chip(compiled, D)
    shape, names, axis = LAYOUTS[layout]  # HLO numbers chips in mesh order, not position order
    order = [names.index(n) for n in ((axis,) if isinstance(axis, str) else axis)]
    partition_of_position = np.arange(D).reshape(shape).transpose(order).ravel()
    by_position = [comm["per_chip"][p] for p in partition_of_position]
    assert by_position == expected_received_bytes(mode, D, CASE.T // D), comm["ops"]
    per_direction = {"p2p": STATE_BYTES, "all_gather": (D - 1) * PAIR_BYTES,
                     "log_scan": math.ceil(math.log2(D)) * PAIR_BYTES}.get(mode)
    if per_direction is not None:  # the table's bound, once the state extras are taken out
        assert comm["max_bytes"] - 4 * (D - 1) * STATE_BYTES // D <= 2 * per_direction


@pytest.mark.timeout(120)
def test_bf16_inputs():
    # bf16 q, k, v, g, beta on both sides, float32 inside; o comes back bf16, so the two may
    # differ by bf16 rounding of the output (2^-8 relative per element): tolerance 1e-2. The
    # final state is float32 on both sides: TOL. Forward only (the gradients are the fp32
    # tests' business; bf16 only changes the casts at the boundary).
    mesh, axis, _ = mesh_of("D2")
    args, _ = inputs(jnp.bfloat16)

    def forward(rule):
        return jax.jit(lambda *a: rule(*a[:5], initial_state=a[5], output_final_state=True,
                                       use_qk_l2norm=True, chunk_size=CASE.chunk_size))(*args)

    o, h = forward(functools.partial(chunk_gated_delta_rule_cp, mesh=mesh, axis=axis,
                                     mode="log_scan"))
    o_ref, h_ref = forward(jax_gdn.chunk_gated_delta_rule)
    assert o.dtype == jnp.bfloat16 and h.dtype == jnp.float32
    assert_close("o", o_ref, o, 1e-2)
    assert_close("final_state", h_ref, h, TOL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", ["D4", "2x2-ba"])
def test_conv_halo(layout):
    mesh, axis, D = mesh_of(layout)
    x_BTC = jnp.arange(1 * 4 * D * 3, dtype=jnp.float32).reshape(1, 4 * D, 3)
    spec = jax.sharding.PartitionSpec(None, axis)
    halo = jax.jit(jax.shard_map(lambda x: conv_halo(x, halo=3, axis=axis), mesh=mesh,
                                 in_specs=spec, out_specs=spec))(x_BTC)
    expected = np.concatenate([np.zeros((1, 3, 3))] + [
        np.asarray(x_BTC[:, 4 * j - 3:4 * j]) for j in range(1, D)], axis=1)
    np.testing.assert_array_equal(np.asarray(halo), expected)
    with pytest.raises(ValueError, match="local shard of 4 tokens .* halo of 5 tokens"):
        jax.shard_map(lambda x: conv_halo(x, halo=5, axis=axis), mesh=mesh, in_specs=spec,
                      out_specs=spec)(x_BTC)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,layout,T,match", [
    ("ring", "D2", 120, "mode='ring' is not one of: ulysses, p2p, all_gather, log_scan"),
    ("p2p", "2x2", 118, "seq_len=118 is not divisible by chips=4"),
    ("all_gather", "D2", 119, "seq_len=119 is not divisible by chips=2"),
])
def test_validation_errors_name_numbers(mode, layout, T, match):
    mesh, axis, _ = mesh_of(layout)
    args, _ = inputs()
    q, k, v, g, beta, h0 = args
    with pytest.raises(ValueError, match=match):
        chunk_gated_delta_rule_cp(*(x[:, :T] for x in (q, k, v, g, beta)), mesh=mesh,
                                  axis=axis, mode=mode, initial_state=h0)
    with pytest.raises(ValueError, match=r"axis='seq' must name axes of the mesh"):
        chunk_gated_delta_rule_cp(q, k, v, g, beta, mesh=mesh, axis="seq", mode="p2p")



# Async start/done pairs (GPU/TPU spelling; CPU emits sync ops), an iota replica-group list,
# names without '%', and a tuple-shaped all-to-all.
ASYNC_HLO = """HloModule m, num_partitions=4

ENTRY main {
  p0 = f32[8]{0} parameter(0)
  p1 = bf16[2,4]{1,0} parameter(1)
  ags = (f32[8]{0}, f32[16]{0}) all-gather-start(p0), replica_groups=[2,2]<=[2,2]T(1,0)
  agd = f32[16]{0} all-gather-done(ags)
  cps = (f32[8], f32[8]) collective-permute-start(p0), source_target_pairs={{0,1},{2,3}}
  cpd = f32[8]{0} collective-permute-done(cps)
  ars = f32[8]{0} all-reduce-start(p0), replica_groups={}, to_apply=add
  ard = f32[8]{0} all-reduce-done(ars)
  a2a = (bf16[2,4]{1,0}, bf16[2,4]{1,0}) all-to-all(p1, p1), replica_groups={{0,1},{2,3}}
  ROOT t = (f32[16]{0}, f32[8]{0}) tuple(agd, cpd)
}
"""


@pytest.mark.timeout(10)
def test_hlo_comm_counts_async_pairs_once():
    comm = received_bytes_per_chip(ASYNC_HLO, 4)
    assert [op["op"] for op in comm["ops"]] == [
        "all-gather", "collective-permute", "all-reduce", "all-to-all"]
    assert comm["ops"][0]["groups"] == [[0, 2], [1, 3]]
    # all-gather (G−1)·32 = 32; permute 32 to chips 1, 3; all-reduce 2·3/4·32 = 48;
    # all-to-all (G−1)/G · (16 + 16) = 16
    assert comm["per_chip"] == [96, 128, 96, 128] and comm["max_bytes"] == 128


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout,case", GQA_CASES, ids=lambda x: getattr(x, "id", x))
def test_ulysses_gqa_heads(layout, case):
    """Hk < D (or coprime with D): values, final state, gradients equal the single chip and the
    recurrence; the HLO's bytes match the formula with the copied key heads."""
    compiled, o, h, grads = cp_run("ulysses", layout, case)
    o_ref, h_ref, grads_ref = single_chip(case)
    assert_close("o", o_ref, o, TOL)
    assert_close("final_state", h_ref, h, TOL)
    for name, ref, got in zip(NAMES, grads_ref, grads):
        assert_close(f"d{name}", ref, got, TOL)
    assert_close("o vs recurrence", recurrence(case), o, TOL)
    D = mesh_of(layout)[2]
    comm = received_bytes_per_chip(compiled, D)
    assert comm["per_chip"] == expected_received_bytes("ulysses", D, case.T // D, case), \
        comm["ops"]


@pytest.mark.timeout(60)
def test_ulysses_value_heads_not_divisible():
    mesh, axis, _ = mesh_of("D4")
    q, k, v, g, beta, _ = inputs()[0]
    with pytest.raises(ValueError, match=r"value heads \(6\) divisible by chips=4; chips must "
                                         r"be one of 1, 2, 3, 6"):
        chunk_gated_delta_rule_cp(q[:, :, :3], k[:, :, :3], v[:, :, :6], g[..., :6],
                                  beta[..., :6], mesh=mesh, axis=axis, mode="ulysses")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_one_chip_is_the_one_chip_rule_bit_for_bit(layout):
    """On a one-chip mesh every mode runs the plain rule (no fold, no exchange): o and the
    final state equal chunk_gated_delta_rule's bit for bit (the fold's round-off would show)."""
    x = make_inputs(RuleCase(1, 128, 1, 2, 32, 32, "weak", 16), seed=0)
    args = [jnp.asarray(x[n]) for n in ("q", "k", "v", "g", "beta")]
    common = dict(initial_state=jnp.asarray(x["initial_state"]), output_final_state=True,
                  use_qk_l2norm=True, chunk_size=16)
    mesh = Mesh(np.array(jax.devices()[:1]), ("cp",))
    o_1, final_1 = jax.jit(lambda *a: jax_gdn.chunk_gated_delta_rule(*a, **common))(*args)
    for mode in CP_MODES:
        o, final = jax.jit(lambda *a: chunk_gated_delta_rule_cp(
            *a, mesh=mesh, axis="cp", mode=mode, layout=layout, **common))(*args)
        assert bool((o == o_1).all()) and bool((final == final_1).all()), mode


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", CP_MODES)
def test_final_state_gradients_without_the_varying_check(mode):
    # The CP step runs its shard_map with check_vma=False: there a final state gathered with
    # all_gather(to="invarying") gave each chip D copies of its cotangent (ulysses did).
    from jax.sharding import PartitionSpec as P

    from gdn_core.jax_gdn.cp.rule import cp_rule_shard_unchecked

    mesh, axis, _ = mesh_of("D2")
    args, (w_o, w_h) = inputs()

    def loss(q, k, v, g, beta, h0):
        def shard(q, k, v, g, beta, h0):
            return cp_rule_shard_unchecked(q, k, v, g, beta, axis=axis, mode=mode,
                                           initial_state=h0, output_final_state=True,
                                           use_qk_l2norm=True, chunk_size=CASE.chunk_size)

        seq = P(None, axis)
        o, h = jax.shard_map(shard, mesh=mesh, in_specs=(seq,) * 5 + (P(),),
                             out_specs=(seq, P()), check_vma=False)(q, k, v, g, beta, h0)
        return jnp.sum(o * w_o) + jnp.sum(h * w_h)

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(6))))(*args)
    _, _, grads_ref = single_chip()
    for name, ref, got in zip(NAMES, grads_ref, grads):
        assert_close(f"d{name}", ref, got, TOL)
