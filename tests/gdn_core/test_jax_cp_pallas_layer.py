"""The JAX CP GDN layer with the Pallas chunk rule as its one-chip rule (cp/layer.py's
rule_kernel: kernels="fused"), under Pallas's interpreter on virtual CPU chips, against the
single-chip reference layer (jax_gdn.layer.gdn_layer with the reference chunk rule).

One jit per case returns the output, the input gradient and every parameter gradient of Σ y·w
(w a fixed random weight). The layer runs inside a shard_map with check_vma=False, as the CP
train step runs it (pallas_call's outputs carry no varying-axes type), so each chip's parameter
gradient is its own contribution: psum'd here, as the step's gradient sync does.
Default tier: each mode once on D = 2 (zigzag and packed documents in half of them); the
mode × layout × documents product under `slow`.
Legend: B batch, T global tokens, t = T/D, D chips.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdn_core.config import GDNConfig
from gdn_core.cp_layout import shard_order
from gdn_core.cp_modes import CP_MODES
from gdn_core.jax_gdn.cp.layer import cp_gdn_layer_unchecked
from gdn_core.jax_gdn.layer import gdn_layer
from gdn_core.jax_gdn.pallas import chunk_gated_delta_rule_pallas
from gdn_core.jax_gdn.params import init_layer_params
from gdn_core.testing import assert_close

# GQA r = 2, Dk ≠ Dv, Hv divisible by D (ulysses); t = 60: not a multiple of the 16-token chunk
# (the kernel pads), 30-token zigzag segments.
CFG = GDNConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16,
                conv_kernel_size=4, chunk_size=16)
B, T, D = 2, 120, 2
TOL = 1e-4
DOCUMENTS = (0, 37, 60, 95, 120)  # a start on the chip boundary (60), others inside
KERNEL = functools.partial(chunk_gated_delta_rule_pallas, interpret=True)


@functools.cache
def layer_inputs():
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    params = init_layer_params(CFG, keys[0])
    x_BTD = jax.random.normal(keys[1], (B, T, CFG.hidden_size), jnp.float32)
    w_BTD = jax.random.normal(keys[2], (B, T, CFG.hidden_size), jnp.float32)
    return params, x_BTD, w_BTD


def _cu(documents: bool):
    return jnp.array(DOCUMENTS, jnp.int32) if documents else None


@functools.cache
def reference(documents: bool):
    params, x_BTD, w_BTD = layer_inputs()

    def loss(params, x_BTD):
        y_BTD = gdn_layer(params, x_BTD, CFG, cu_seqlens=_cu(documents))
        return jnp.sum(y_BTD * w_BTD), y_BTD

    (dparams, dx_BTD), y_BTD = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(
        params, x_BTD)
    return y_BTD, dx_BTD, dparams


def with_pallas_rule(mode: str, layout: str, documents: bool):
    """(y, dx, dparams) of the CP layer with the Pallas rule, in sequence order."""
    params, x_BTD, w_BTD = layer_inputs()
    mesh = Mesh(np.array(jax.devices()[:D]), ("cp",))
    order = shard_order(chips=D, seq_len=T, layout=layout)
    back = np.argsort(order)
    cu = _cu(documents)

    def shard(params, x_BtD, w_BtD):
        def loss(params, x_BtD):
            y_BtD = cp_gdn_layer_unchecked(params, x_BtD, CFG, axis="cp", mode=mode,
                                           layout=layout, cu_seqlens=cu, rule_kernel=KERNEL)
            return jnp.sum(y_BtD * w_BtD), y_BtD

        (dparams, dx_BtD), y_BtD = jax.grad(loss, argnums=(0, 1), has_aux=True)(params, x_BtD)
        return y_BtD, dx_BtD, jax.lax.psum(dparams, "cp")

    seq = P(None, "cp")
    run = jax.jit(jax.shard_map(shard, mesh=mesh, in_specs=(P(), seq, seq),
                                out_specs=(seq, seq, P()), check_vma=False))
    y_BTD, dx_BTD, dparams = run(params, x_BTD[:, order], w_BTD[:, order])
    return y_BTD[:, back], dx_BTD[:, back], dparams


def check(mode: str, layout: str, documents: bool):
    want = reference(documents)
    got = with_pallas_rule(mode, layout, documents)
    where = f"{mode}/{layout}/D{D}/docs={documents}"
    assert_close(f"{where}: y", want[0], got[0], TOL)
    assert_close(f"{where}: dx", want[1], got[1], TOL)
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want[2]),
                            jax.tree_util.tree_leaves(got[2])):
        assert_close(f"{where}: d{jax.tree_util.keystr(path)}", w, g, TOL)


DEFAULT_TIER = [("ulysses", "contiguous", False), ("p2p", "zigzag", True),
                ("all_gather", "contiguous", True), ("log_scan", "zigzag", False)]
"""Each mode once; zigzag and packed documents twice each."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode, layout, documents", DEFAULT_TIER)
def test_each_mode_with_the_pallas_rule_matches_the_reference_layer(mode, layout, documents):
    check(mode, layout, documents)


def test_the_default_tier_covers_every_mode():
    assert sorted(mode for mode, _, _ in DEFAULT_TIER) == sorted(CP_MODES)


SLOW_TIER = [(mode, layout, documents) for mode in CP_MODES
             for layout in ("contiguous", "zigzag") for documents in (False, True)
             if (mode, layout, documents) not in DEFAULT_TIER]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("mode, layout, documents", SLOW_TIER)
def test_every_mode_layout_and_documents_with_the_pallas_rule(mode, layout, documents):
    check(mode, layout, documents)
