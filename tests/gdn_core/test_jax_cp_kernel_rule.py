"""The Pallas chunk rule composed with every JAX CP mode (cp/kernel_rule.py) on virtual CPU
chips, under Pallas's interpreter, against the one-chip reference rule (jax_gdn.chunk).

Inputs are realistic (keys of a head at cosine 0.9 to a shared direction, β ∈ U(0.5, 1), weak
decay, so state would leak across a document boundary if it could); float32 within 1e-4
(relative, Frobenius): o, the final state and the gradients of q, k, v, g, β and h0.
Default tier: D = 2, every mode × layout, packed documents in half of them; the rest of the
mode × layout × documents product on D = 2, and all of it on D = 4, under `slow`.
Global arrays hold the sequence in shard order (cp_layout.shard_order), undone for comparing.
Legend: B batch, T global tokens, D chips, Hk/Hv key/value heads, K/V head dims.
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
from gdn_core.jax_gdn.chunk import chunk_gated_delta_rule
from gdn_core.jax_gdn.cp.kernel_rule import (KERNEL_CP_MODES, kernel_cp_rule_shard,
                                             kernel_rule_shard)
from gdn_core.jax_gdn.pallas.chunk_rule import chunk_gated_delta_rule_pallas
from gdn_core.testing import assert_close

from .rule_inputs import RuleCase, make_inputs

TOL = 1e-4
CASE = RuleCase(1, 128, 2, 4, 16, 16, "weak", 16)  # zigzag on D = 4: 16-token segments;
# Hv = 4 for ulysses on D = 4, Hk = 2 < D for its key-head copies
OUTPUTS = ("o", "final", "dq", "dk", "dv", "dg", "dbeta", "dh0")
DOCUMENTS = (0, 20, 40, 64, 100, 128)  # a start on a chip boundary (64), others inside


@functools.cache
def inputs():
    return {name: jnp.asarray(a) for name, a in make_inputs(CASE, seed=11).items()}


def loss_and_grads(rule):
    def loss(q, k, v, g, beta, h0):
        o, final = rule(q, k, v, g, beta, h0)
        return jnp.sum(o * jnp.cos(o)) + jnp.sum(final * final), (o, final)

    x = inputs()
    args = [x[n] for n in ("q", "k", "v", "g", "beta", "initial_state")]
    (_, (o, final)), grads = jax.jit(jax.value_and_grad(loss, argnums=range(6),
                                                        has_aux=True))(*args)
    return dict(zip(OUTPUTS, (o, final, *grads)))


@functools.cache
def reference(documents: bool):
    cu = jnp.array(DOCUMENTS) if documents else None
    return loss_and_grads(lambda *a: chunk_gated_delta_rule(
        *a[:5], initial_state=a[5], output_final_state=True, use_qk_l2norm=True,
        chunk_size=CASE.chunk_size, cu_seqlens=cu))


def composed(mode: str, layout: str, D: int, documents: bool, platform: str = "tpu"):
    """The rule on global arrays: shard order, shard_map of kernel_rule_shard, order undone."""
    mesh = Mesh(np.array(jax.devices()[:D]), ("cp",))
    order = shard_order(chips=D, seq_len=CASE.T, layout=layout)
    back = np.argsort(order)
    kernel = functools.partial(chunk_gated_delta_rule_pallas, platform=platform,
                               interpret=True)
    cu = jnp.array(DOCUMENTS) if documents else None

    def shard(q, k, v, g, beta, h0, cu):
        return kernel_cp_rule_shard(q, k, v, g, beta, kernel=kernel, axis="cp", mode=mode,
                                    initial_state=h0, output_final_state=True,
                                    use_qk_l2norm=True, chunk_size=CASE.chunk_size,
                                    layout=layout, cu_seqlens=cu)

    seq = P(None, "cp")
    # check_vma=False, as the CP train step runs (cp/step.py): pallas_call's outputs carry no
    # varying-axes type, and the interpreter's kernel body mixes per-chip and constant values.
    run = jax.shard_map(shard, mesh=mesh, in_specs=(seq,) * 5 + (P(), P()),
                        out_specs=(seq, P()), check_vma=False)

    def rule(q, k, v, g, beta, h0):
        o, final = run(*(x[:, order] for x in (q, k, v, g, beta)), h0, cu)
        return o[:, back], final

    return rule


def check(mode, layout, D, documents, platform="tpu"):
    want = reference(documents)
    got = loss_and_grads(composed(mode, layout, D, documents, platform))
    for name in OUTPUTS:
        assert_close(f"{mode}/{layout}/D{D}/docs={documents}: {name}", want[name], got[name],
                     TOL)


DEFAULT_TIER = [(mode, layout, (i + j) % 2 == 1) for i, mode in enumerate(KERNEL_CP_MODES)
                for j, layout in enumerate(("contiguous", "zigzag"))]
"""Every mode × layout on D = 2, packed documents in half of them (each mode once with)."""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode, layout, documents", DEFAULT_TIER)
def test_each_mode_and_layout_on_two_chips(mode, layout, documents):
    check(mode, layout, 2, documents)


@pytest.mark.timeout(300)
def test_one_chip_runs_the_kernel_alone():
    check("p2p", "contiguous", 1, True)


@pytest.mark.timeout(300)
def test_the_gpu_parameterisation_composes_too():
    """The kernel is reached through its call alone: the GPU kernels (interpreted) as well."""
    check("log_scan", "contiguous", 2, True, platform="gpu")


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode='ring' is not one of: ulysses, p2p"):
        kernel_rule_shard(None, *([None] * 6), axis="cp", mode="ring",
                          output_final_state=False, use_qk_l2norm=False)


SLOW_TIER = ([(mode, layout, not documents, 2) for mode, layout, documents in DEFAULT_TIER]
             + [(mode, layout, documents, 4) for mode in KERNEL_CP_MODES
                for layout in ("contiguous", "zigzag") for documents in (False, True)])


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("mode, layout, documents, D", SLOW_TIER)
def test_every_mode_layout_and_documents(mode, layout, documents, D):
    check(mode, layout, D, documents)
