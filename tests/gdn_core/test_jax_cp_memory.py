"""Per-chip footprint of the sequence-sharded CP modes: memory flat in D, comm flat in T.

Legend: B batch, T_local tokens per chip, D chips, Hk/Hv heads, Dk/Dv head dims, C chunk.
Programs: jit(grad) of Σ o² w.r.t. q, k, v, g, beta through chunk_gated_delta_rule_cp (no
initial or final state), compiled only — never run. Per-chip memory is XLA's
memory_analysis(): temp_size + argument_size + output_size − alias_size (bytes; on CPU
alias is 0 and generated_code is not counted; arguments and outputs are per shard).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core.jax_gdn.cp import chunk_gated_delta_rule_cp
from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip

B, HK, HV, DK, DV, CHUNK = 1, 4, 8, 16, 32, 16
# A shard large enough that the chunk-local work, not the (A, b) exchange, sets the peak, as
# at production sizes: at T_local = 32 the exchange's few transient pairs are ~6% of the total.
T_LOCAL = 128
PAIR_BYTES = B * HV * DK * (DK + DV) * 4
STATE_BYTES = B * HV * DK * DV * 4
SEQUENCE_MODES = ("p2p", "log_scan", "all_gather")


@functools.cache
def compiled_grad(mode, D, T_local):
    mesh = Mesh(np.array(jax.devices()[:D]), ("cp",))
    T = D * T_local
    shapes = [(B, T, HK, DK), (B, T, HK, DK), (B, T, HV, DV), (B, T, HV), (B, T, HV)]

    def loss(q, k, v, g, beta):
        o, _ = chunk_gated_delta_rule_cp(q, k, v, g, beta, mesh=mesh, axis="cp", mode=mode,
                                         chunk_size=CHUNK)
        return jnp.sum(o * o)

    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.jit(jax.grad(loss, argnums=tuple(range(5)))).lower(*args).compile()


def bytes_per_chip(mode, D, T_local=T_LOCAL):
    m = compiled_grad(mode, D, T_local).memory_analysis()
    return (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["p2p", "log_scan"])
def test_memory_flat_in_chips(mode):
    # Exchange residuals are this chip's A and h_in only (custom VJP); what remains is the
    # exchange's transient pairs/states, independent of the sequence.
    base = bytes_per_chip(mode, 2)
    for D in (4, 8):
        growth = bytes_per_chip(mode, D) / base - 1
        assert abs(growth) <= 0.02, f"{mode}: D={D} uses {growth:+.2%} vs D=2 ({base} bytes)"


@pytest.mark.timeout(120)
def test_all_gather_memory_grows_at_most_by_the_gathered_pairs():
    # The only D-sized buffers are the gathered [D] pairs of each direction, transient (the
    # custom VJP keeps A and h_in, not the gathered stack, and the backward re-gathers
    # (Aᵀ, ∂L/∂h_in) instead of keeping them): the growth is bounded by D·pair bytes.
    base = bytes_per_chip("all_gather", 2)
    for D in (4, 8):
        growth = bytes_per_chip("all_gather", D) - base
        assert growth <= D * PAIR_BYTES, f"D={D}: +{growth} bytes > {D} pairs"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", SEQUENCE_MODES)
def test_memory_at_most_doubles_with_the_local_shard(mode):
    # Linear in T_local; 1% allowance for XLA's buffer packing (measured 2.002–2.007×).
    ratio = bytes_per_chip(mode, 2, 2 * T_LOCAL) / bytes_per_chip(mode, 2)
    assert 1.5 <= ratio <= 2.0 * 1.01, f"{mode}: doubling T_local scales memory {ratio:.4f}×"


def expected_received_bytes(mode, D):
    """Per chip (index = position), forward + backward, by the docs/architecture.md table."""
    shifts = [2 ** r for r in range(math.ceil(math.log2(D)))]
    if mode == "p2p":
        return [STATE_BYTES * ((j >= 1) + (j <= D - 2)) for j in range(D)]
    if mode == "all_gather":
        return [2 * (D - 1) * PAIR_BYTES] * D
    # log_scan; the backward's last round carries only λ's state part (see log_scan.py)
    return [sum(PAIR_BYTES * (j >= d) + (j + d < D) * (
        STATE_BYTES if d == shifts[-1] else PAIR_BYTES) for d in shifts) for j in range(D)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", SEQUENCE_MODES)
def test_comm_matches_table_and_ignores_sequence_length(mode):
    for D in (2, 4, 8):
        comm = received_bytes_per_chip(compiled_grad(mode, D, T_LOCAL), D)
        assert comm["per_chip"] == expected_received_bytes(mode, D), (D, comm["ops"])
    doubled = received_bytes_per_chip(compiled_grad(mode, 2, 2 * T_LOCAL), 2)
    assert doubled["per_chip"] == expected_received_bytes(mode, 2)
