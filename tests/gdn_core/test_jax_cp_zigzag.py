"""JAX GDN context parallelism under the zigzag layout: every mode against one chip.

Legend: B batch, T global tokens, D chips, E = 2D segments of s = T/(2D) tokens (segment e on
chip e for e < D, on chip 2D−1−e after), Hk/Hv key/value heads, Dk/Dv head dims.
Global arrays hold the sequence in shard order (x[:, order], order = cp_layout.shard_order),
and outputs come back in it: compared after undoing the order. Oracles: the single-chip rule
and layer on the sequence in order, and the token-by-token recurrence. To keep compiles few
(the cost here), one jit per D holds all four modes — rule outputs and gradients in one
program, layer outputs and gradients in another; the comm figure is read from the rule's
program and compared with the sum of the modes' figures (each counted from the segment
schedule, independently of the code). The contiguous layout is tests/gdn_core/test_jax_cp*.py.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdn_core import jax_gdn
from gdn_core.config import GDNConfig
from gdn_core.cp_layout import segments, shard_order
from gdn_core.cp_modes import CP_MODES
from gdn_core.jax_gdn.cp import cp_gdn_layer, chunk_gated_delta_rule_cp, gdn_layer_cp
from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip
from gdn_core.jax_gdn.layer import gdn_layer
from gdn_core.jax_gdn.params import init_layer_params
from gdn_core.testing import assert_close

from .rule_inputs import RuleCase, make_inputs

MODES = CP_MODES
# s = 28, 14 (7 under slow): never a multiple of the 16-token chunk, at least the conv halo 3.
CASE = RuleCase(1, 112, 4, 8, 16, 32, "mixed", 16)
CFG = GDNConfig(hidden_size=32, num_k_heads=4, num_v_heads=8, head_k_dim=8, head_v_dim=16,
                conv_kernel_size=4, chunk_size=16)
B_LAYER = 2
NAMES = ("q", "k", "v", "g", "beta", "initial_state")
STATE_BYTES = CASE.B * CASE.Hv * CASE.Dk * CASE.Dv * 4
PAIR_BYTES = CASE.B * CASE.Hv * CASE.Dk * (CASE.Dk + CASE.Dv) * 4
TOL = 1e-4
CHIPS = [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]


def mesh_of(D):
    return Mesh(np.array(jax.devices()[:D]), ("cp",))


def order_of(D, T=CASE.T):
    return shard_order(chips=D, seq_len=T, layout="zigzag")


@functools.cache
def rule_inputs():
    x = make_inputs(CASE)
    x["g"][:, 5::7, 1] = -20.0  # strong decay on some tokens, some at segment edges
    x["g"][:, 27:30, 3] = -20.0
    rng = np.random.default_rng(1)  # loss weights so every output element reaches the loss
    w = (rng.standard_normal((CASE.B, CASE.T, CASE.Hv, CASE.Dv)).astype(np.float32),
         rng.standard_normal((CASE.B, CASE.Hv, CASE.Dk, CASE.Dv)).astype(np.float32))
    return [jnp.asarray(x[n]) for n in NAMES], tuple(jnp.asarray(a) for a in w)


def rule_loss(rule, order):
    """Σ o·w + Σ h·w_h for a rule fed the sequence in `order` (w laid out the same way)."""
    _, (w_o, w_h) = rule_inputs()

    def loss(q, k, v, g, beta, h0):
        o, h = rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                    use_qk_l2norm=True, chunk_size=CASE.chunk_size)
        return jnp.sum(o * w_o[:, order]) + jnp.sum(h * w_h), (o, h)

    return jax.grad(loss, argnums=tuple(range(6)), has_aux=True)


@functools.cache
def single_chip_rule():
    args, _ = rule_inputs()
    grads, (o, h) = jax.jit(rule_loss(jax_gdn.chunk_gated_delta_rule, np.arange(CASE.T)))(*args)
    o_rec, _ = jax.jit(lambda *a: jax_gdn.recurrent_gated_delta_rule(
        *a[:5], initial_state=a[5], use_qk_l2norm=True))(*args)
    return o, h, grads, o_rec


@functools.cache
def zigzag_rules(D):
    """Compile once for all modes; (compiled, {mode: (o, h, grads)} in sequence order)."""
    mesh, order = mesh_of(D), order_of(D)
    args, _ = rule_inputs()
    sharded = [a[:, order] for a in args[:5]] + [args[5]]

    def every_mode(*a):
        return {mode: rule_loss(functools.partial(chunk_gated_delta_rule_cp, mesh=mesh,
                                                  axis="cp", mode=mode, layout="zigzag"),
                                order)(*a) for mode in MODES}

    compiled = jax.jit(every_mode).lower(*sharded).compile()
    back = np.argsort(order)
    results = {}
    for mode, (grads, (o, h)) in compiled(*sharded).items():
        results[mode] = (o[:, back], h, [g[:, back] for g in grads[:5]] + [grads[5]])
    return compiled, results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", CHIPS)
def test_rule_matches_single_chip_and_recurrence(D):
    o_ref, h_ref, grads_ref, o_rec = single_chip_rule()
    for mode, (o, h, grads) in zigzag_rules(D)[1].items():
        assert_close(f"{mode} o", o_ref, o, TOL)
        assert_close(f"{mode} o vs recurrence", o_rec, o, TOL)
        assert_close(f"{mode} final_state", h_ref, h, TOL)
        for name, ref, got in zip(NAMES, grads_ref, grads):
            assert_close(f"{mode} d{name}", ref, got, TOL)


def owners(D):
    """(chip, slot) of each of the 2D segments, from cp_layout.segments."""
    where = {}
    for chip in range(D):
        for slot, e in enumerate(segments(chip=chip, chips=D, layout="zigzag")):
            where[e] = (chip, slot)
    return [where[e] for e in range(2 * D)]


def received_by_schedule(D, moves_per_round, size=STATE_BYTES):
    """Bytes per chip of rounds of segment moves of `size` bytes: a move between two chips
    costs its target `size`; one inside a chip (segments D−1 and D) costs nothing."""
    chip = [c for c, _ in owners(D)]
    total = [0] * D
    for moves in moves_per_round:
        for src, dst in moves:
            if chip[src] != chip[dst]:
                total[chip[dst]] += size
    return total


def log_scan_received(D, *, reverse: bool):
    """Bytes per chip of the Hillis–Steele prefix over the 2D segments, one direction.

    Each move sends a pair (A: Dk·Dk, b: Dk·Dv per head); the forward uses the whole prefix
    (h_in = E(h0)), the backward only its b part (λ = E(0)), so XLA drops every A part that
    nothing downstream reads. What is read is found here by liveness over the program's values:
    each slot (a chip's first or second segment, all chips alike) keeps an exclusive X and an
    inclusive P; in round d the segment e receives R = P of segment e−d (e+d if reverse),
    X ← X∘R (X ← R on its first receipt), P ← P∘R while 2d < 2D; the composition
    (X_A R_A, X_A R_b + X_b) reads R_A only for the A part.
    """
    E, where = 2 * D, owners(D)
    shifts = [2 ** r for r in range(math.ceil(math.log2(E)))]
    rounds = [[(e + d, e) if reverse else (e, e + d) for e in range(E - d)] for d in shifts]
    receiving = [{where[dst][1] for _, dst in moves} for moves in rounds]
    first = {slot: min(r for r, slots in enumerate(receiving) if slot in slots)
             for slot in (0, 1)}
    need_X = {slot: ({"b"} if reverse else {"A", "b"}) for slot in (0, 1)}
    need_P = {0: set(), 1: set()}
    need_R = [None] * len(rounds)
    for r in reversed(range(len(rounds))):
        need_R[r] = {0: set(), 1: set()}
        for slot in receiving[r]:
            if 2 * shifts[r] < E and need_P[slot]:  # P ← P∘R
                need_R[r][slot] |= need_P[slot]
                need_P[slot] = {"A", "b"} if "b" in need_P[slot] else {"A"}
            need_R[r][slot] |= need_X[slot]  # X ← X∘R, or X ← R the first time
            need_X[slot] = set() if r == first[slot] else (
                {"A", "b"} if "b" in need_X[slot] else {"A"} if need_X[slot] else set())
        for src, dst in rounds[r]:  # what a round sends is P before its update
            need_P[where[src][1]] |= need_R[r][where[dst][1]]
    part = {"A": STATE_BYTES * CASE.Dk // CASE.Dv, "b": STATE_BYTES}
    total = [0] * D
    for r, moves in enumerate(rounds):
        for src, dst in moves:
            (source_chip, _), (chip, slot) = where[src], where[dst]
            if source_chip != chip:
                total[chip] += sum(part[p] for p in need_R[r][slot])
    return total


def expected_received_bytes(mode, D):
    """Per chip, forward + backward of the rule program under zigzag, by the modes' designs
    (docs/architecture.md's exchanges over 2D segments), plus the state extras: the final state
    and ∂L/∂h0 all-reduced (ring, 2(D−1)/D of the size), ulysses too (its final state summed
    from each chip's zero-padded heads), as under the contiguous layout."""
    E, T_local = 2 * D, CASE.T // D
    ring = 2 * (D - 1) * STATE_BYTES // D
    if mode == "ulysses":  # the contiguous figure: the reordering is local
        Hk, Hv = CASE.Hk, CASE.Hv  # G key heads per chip: copies when Hk < D
        G = Hk // D if Hk % D == 0 else 1 if D % Hk == 0 else Hv // D
        channels = 2 * G * CASE.Dk + (Hv // D) * (2 * CASE.Dv + 2)
        tokens = 2 * (D - 1) * CASE.B * T_local * channels * 4
        return [tokens + 2 * ring] * D
    if mode == "all_gather":  # both pairs of every other chip, each direction
        return [2 * 2 * (D - 1) * PAIR_BYTES + 2 * ring] * D
    if mode == "p2p":  # the wavefront 0 → 1 → … → 2D−1 and back, one state per move
        forward = received_by_schedule(D, [[(e, e + 1)] for e in range(E - 1)])
        backward = received_by_schedule(D, [[(e + 1, e)] for e in range(E - 1)])
        return [a + b + 2 * ring for a, b in zip(forward, backward)]
    return [a + b + 2 * ring for a, b in zip(log_scan_received(D, reverse=False),
                                             log_scan_received(D, reverse=True))]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", CHIPS)
def test_rule_comm_matches_table(D):
    comm = received_bytes_per_chip(zigzag_rules(D)[0], D)
    expected = [sum(chip) for chip in zip(*(expected_received_bytes(m, D) for m in MODES))]
    # Exact per chip: so no mode moves anything of sequence length (no re-shard to contiguous)
    # beyond ulysses' all-to-alls, which are the contiguous layout's.
    assert comm["per_chip"] == expected, comm["ops"]


@functools.cache
def layer_inputs():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = init_layer_params(CFG, keys[0])
    x_BTD = jax.random.normal(keys[1], (B_LAYER, CASE.T, CFG.hidden_size), jnp.float32)
    w_BTD = jax.random.normal(keys[2], (B_LAYER, CASE.T, CFG.hidden_size), jnp.float32)
    return params, x_BTD, w_BTD


def layer_grads(layer, order):
    _, _, w_BTD = layer_inputs()

    def loss(params, x_BTD):
        y_BTD = layer(params, x_BTD, CFG)
        return jnp.sum(y_BTD * w_BTD[:, order]), y_BTD

    return jax.grad(loss, argnums=(0, 1), has_aux=True)


@functools.cache
def single_chip_layer():
    params, x_BTD, _ = layer_inputs()
    return jax.jit(layer_grads(gdn_layer, np.arange(CASE.T)))(params, x_BTD)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", CHIPS)
def test_layer_matches_single_chip(D):
    mesh, order = mesh_of(D), order_of(D)
    params, x_BTD, _ = layer_inputs()

    def every_mode(params, x_BTD):
        return {mode: layer_grads(functools.partial(gdn_layer_cp, mesh=mesh, axis="cp",
                                                    mode=mode, layout="zigzag"),
                                  order)(params, x_BTD) for mode in MODES}

    results = jax.jit(every_mode)(params, x_BTD[:, order])
    (dparams_ref, dx_ref), y_ref = single_chip_layer()
    back = np.argsort(order)
    for mode, ((dparams, dx), y) in results.items():
        assert_close(f"{mode} y", y_ref, y[:, back], TOL)
        assert_close(f"{mode} dx", dx_ref, dx[:, back], TOL)
        for path, ref in jax.tree_util.tree_leaves_with_path(dparams_ref):
            got = functools.reduce(lambda node, key: node[key.key], path, dparams)
            assert_close(f"{mode} d{jax.tree_util.keystr(path)}", ref, got, TOL)


@pytest.mark.timeout(60)
def test_bad_layout_or_length_names_the_numbers():
    mesh = mesh_of(4)
    args, _ = rule_inputs()
    q, k, v, g, beta, h0 = args
    with pytest.raises(ValueError, match=r"layout='diagonal' is not one of: contiguous, "
                                         r"zigzag"):
        chunk_gated_delta_rule_cp(q, k, v, g, beta, mesh=mesh, axis="cp", mode="p2p",
                                  layout="diagonal")
    # 108 = 4 · 27 splits over 4 chips, not into 8 segments
    with pytest.raises(ValueError, match=r"seq_len=108 is not divisible by 8 \(2 × chips=4\)"):
        chunk_gated_delta_rule_cp(*(x[:, :108] for x in (q, k, v, g, beta)), mesh=mesh,
                                  axis="cp", mode="log_scan", layout="zigzag")
    params, x_BTD, _ = layer_inputs()
    with pytest.raises(ValueError, match=r"seq_len=108 is not divisible by 8 \(2 × chips=4\)"):
        gdn_layer_cp(params, x_BTD[:, :108], CFG, mesh=mesh, axis="cp", mode="ulysses",
                     layout="zigzag")
    # 16 tokens: shards of 4 fit the halo of 3, zigzag segments of 2 do not
    with pytest.raises(ValueError, match=r"zigzag segment of 2 tokens \(seq_len=16 / "
                                         r"\(2 × chips=4\)\) is shorter than the conv halo of 3"):
        gdn_layer_cp(params, x_BTD[:, :16], CFG, mesh=mesh, axis="cp", mode="p2p",
                     layout="zigzag")
    spec = P(None, "cp")
    with pytest.raises(ValueError, match=r"layout='diagonal' is not one of"):
        jax.shard_map(functools.partial(cp_gdn_layer, cfg=CFG, axis="cp", mode="p2p",
                                        layout="diagonal"),
                      mesh=mesh, in_specs=(P(), spec), out_specs=spec)(params, x_BTD)
