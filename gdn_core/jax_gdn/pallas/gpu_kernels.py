"""The GPU (Triton) parameterisation of the chunk rule: chunk-parallel work around sequential
state passes, as fla's kernels are laid out.

A GPU runs every grid point at once, so a state cannot ride a grid axis (the TPU kernel's
way), and one program per (batch, head) looping over everything would leave most of the chip
idle (16 heads: 16 of an H100's 132 SMs). So the forward is three calls:
    1. prepare   grid (B, H, N):      w, u of each chunk (the triangular inverse: the bulk)
    2. states    grid (B, H, V/Vb):   S_{n+1} = a S_n + kdecᵀ (u − w S_n), a loop over the
                                      chunks; stores S_n, [B, H, N, K, V] float32
    3. outputs   grid (B, H, N):      o of each chunk from its S_n (chunk_math.chunk_forward)
and the backward three more:
    1. terms     grid (B, H, N):      c_n = ∂(o_n · do_n)/∂S_n, independent of S
    2. cotangent grid (B, H, V/Vb):   dS_n = A_nᵀ dS_{n+1} + c_n, from the last chunk down;
                                      stores dS_{n+1} per chunk; dS_0 is ∂L/∂h0
    3. grads     grid (B, H, N):      every input's cotangent (chunk_math.chunk_backward)
The passes split the state's columns over programs (Vb of V each): both recurrences act on
columns independently. Residuals: the inputs, S_n per chunk and w (the states pass's).
Array layouts as chunk_kernels.py.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .blocks import BlockPlan
from .chunk_math import (F32, chunk_backward, chunk_forward, chunk_wu, state_cotangent_step,
                         state_cotangent_terms, state_factors, state_step)


def _chunk_specs(C, K, V, group):
    """BlockSpecs over grid (b, h, n): one chunk's rows of each array."""
    return {
        "qk": pl.BlockSpec((None, None, C, K), lambda b, h, n: (b, lax.div(h, group), n, 0)),
        "hk": pl.BlockSpec((None, None, C, K), lambda b, h, n: (b, h, n, 0)),
        "v": pl.BlockSpec((None, None, C, V), lambda b, h, n: (b, h, n, 0)),
        "row": pl.BlockSpec((None, None, None, 1, C), lambda b, h, n: (b, h, n, 0, 0)),
        "seg": pl.BlockSpec((None, None, 1, C), lambda b, h, n: (b, n, 0, 0)),
        "state": pl.BlockSpec((None, None, None, K, V), lambda b, h, n: (b, h, n, 0, 0)),
    }


def _pass_specs(T, N, C, K, Vb, group):
    """BlockSpecs over grid (b, h, j): the whole sequence, state columns j·Vb … (j+1)·Vb."""
    return {
        "qk": pl.BlockSpec((None, None, T, K), lambda b, h, j: (b, lax.div(h, group), 0, 0)),
        "hk": pl.BlockSpec((None, None, T, K), lambda b, h, j: (b, h, 0, 0)),
        "v": pl.BlockSpec((None, None, T, Vb), lambda b, h, j: (b, h, 0, j)),
        "row": pl.BlockSpec((None, None, N, 1, C), lambda b, h, j: (b, h, 0, 0, 0)),
        "seg": pl.BlockSpec((None, N, 1, C), lambda b, h, j: (b, 0, 0, 0)),
        "states": pl.BlockSpec((None, None, N, K, Vb), lambda b, h, j: (b, h, 0, 0, j)),
        "state": pl.BlockSpec((None, None, K, Vb), lambda b, h, j: (b, h, 0, j)),
    }


def _call(body, ins, outs, *, grid, specs, plan: BlockPlan, interpret):
    """pallas_call running `body(*input values or None) -> output values` per grid point.

    ins: [(array or None, spec key)] (None: an absent optional input, passed to body as None);
    outs: [(shape, dtype, spec key)].
    """
    present = [(x, key) for x, key in ins if x is not None]

    def kernel(*refs):
        loaded = iter([ref[...] for ref in refs[:len(present)]])
        values = body(*[None if x is None else next(loaded) for x, _ in ins])
        for ref, value in zip(refs[len(present):], values):
            ref[...] = value.astype(ref.dtype)

    return pl.pallas_call(
        kernel, grid=grid, in_specs=[specs[key] for _, key in present],
        out_specs=[specs[key] for *_, key in outs],
        out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype, _ in outs],
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=plan.num_warps,
                                                num_stages=plan.num_stages),
    )(*[x for x, _ in present])


def _sizes(q, v, G, plan: BlockPlan):
    B, H, N, _, C = G.shape
    V = v.shape[-1]
    Vb = min(V, plan.state_block_v or V)
    return B, H, N, C, q.shape[-1], V, Vb, H // q.shape[1]


def forward(plan: BlockPlan, q, k, v, G, beta, seg, h0, *, store_states: bool, rule, interpret):
    """(o, final, residual): residual (states, w) when store_states, else None."""
    B, H, N, C, K, V, Vb, group = _sizes(q, v, G, plan)
    T = N * C
    l2 = dict(use_qk_l2norm=rule["use_qk_l2norm"])
    chunked = dict(grid=(B, H, N), specs=_chunk_specs(C, K, V, group), plan=plan,
                   interpret=interpret)
    passes = dict(grid=(B, H, V // Vb), specs=_pass_specs(T, N, C, K, Vb, group), plan=plan,
                  interpret=interpret)
    w, u = _call(lambda k, v, G, beta, seg: chunk_wu(k, v, G, beta, seg, **l2),
                 [(k, "qk"), (v, "v"), (G, "row"), (beta, "row"), (seg, "seg")],
                 [((B, H, T, K), F32, "hk"), ((B, H, T, V), F32, "v")], **chunked)

    def state_pass(*refs):
        k_ref, w_ref, u_ref, G_ref, *rest = refs
        seg_ref = rest.pop(0) if seg is not None else None
        h0_ref, states_ref, final_ref = rest

        def step(n, S):
            rows = pl.ds(pl.multiple_of(n * C, C), C)
            states_ref[n] = S
            kdec, carry = state_factors(k_ref[rows, :], G_ref[n],
                                        None if seg_ref is None else seg_ref[n], **l2)
            return state_step(S, w_ref[rows, :], u_ref[rows, :], kdec, carry)

        final_ref[...] = lax.fori_loop(0, N, step, h0_ref[...])

    specs = passes["specs"]
    pass_ins = [(k, "qk"), (w, "hk"), (u, "v"), (G, "row"), (seg, "seg"), (h0, "state")]
    pass_ins = [(x, key) for x, key in pass_ins if x is not None]
    states, final = pl.pallas_call(
        state_pass, grid=passes["grid"], in_specs=[specs[key] for _, key in pass_ins],
        out_specs=[specs["states"], specs["state"]],
        out_shape=[jax.ShapeDtypeStruct((B, H, N, K, V), F32), jax.ShapeDtypeStruct(h0.shape, F32)],
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=plan.pass_num_warps, num_stages=1),
    )(*[x for x, _ in pass_ins])

    def outputs(q, k, v, G, beta, seg, S):
        return chunk_forward(q, k, v, G, beta, S, seg, **rule)[:1]

    o, = _call(outputs, [(q, "qk"), (k, "qk"), (v, "v"), (G, "row"), (beta, "row"),
                         (seg, "seg"), (states, "state")],
               [(v.shape, q.dtype, "v")], **chunked)
    return o, final, ((states, w) if store_states else None)


def backward(plan: BlockPlan, q, k, v, G, beta, seg, residual, do, dfinal, *, rule, interpret):
    """(dq, dk per value head, dv, dG, dβ, dh0), all float32."""
    states, w = residual
    B, H, N, C, K, V, Vb, group = _sizes(q, v, G, plan)
    T = N * C
    l2 = dict(use_qk_l2norm=rule["use_qk_l2norm"])
    chunked = dict(grid=(B, H, N), specs=_chunk_specs(C, K, V, group), plan=plan,
                   interpret=interpret)
    c, = _call(lambda q, k, G, seg, w, do: (state_cotangent_terms(q, k, G, w, do, seg, **l2),),
               [(q, "qk"), (k, "qk"), (G, "row"), (seg, "seg"), (w, "hk"), (do, "v")],
               [((B, H, N, K, V), F32, "state")], **chunked)

    def cotangent_pass(*refs):
        k_ref, w_ref, G_ref, *rest = refs
        seg_ref = rest.pop(0) if seg is not None else None
        c_ref, dfinal_ref, dS_next_ref, dh0_ref = rest

        def step(i, dS):
            n = N - 1 - i
            rows = pl.ds(pl.multiple_of(n * C, C), C)
            dS_next_ref[n] = dS
            kdec, carry = state_factors(k_ref[rows, :], G_ref[n],
                                        None if seg_ref is None else seg_ref[n], **l2)
            return state_cotangent_step(dS, w_ref[rows, :], kdec, carry, c_ref[n])

        dh0_ref[...] = lax.fori_loop(0, N, step, dfinal_ref[...])

    specs = _pass_specs(T, N, C, K, Vb, group)
    pass_ins = [(k, "qk"), (w, "hk"), (G, "row"), (seg, "seg"), (c, "states"),
                (dfinal, "state")]
    pass_ins = [(x, key) for x, key in pass_ins if x is not None]
    dS_next, dh0 = pl.pallas_call(
        cotangent_pass, grid=(B, H, V // Vb), in_specs=[specs[key] for _, key in pass_ins],
        out_specs=[specs["states"], specs["state"]],
        out_shape=[jax.ShapeDtypeStruct((B, H, N, K, V), F32),
                   jax.ShapeDtypeStruct(dfinal.shape, F32)],
        interpret=interpret,
        compiler_params=pltriton.CompilerParams(num_warps=plan.pass_num_warps, num_stages=1),
    )(*[x for x, _ in pass_ins])

    def grads(q, k, v, G, beta, seg, S, do, dS_next):
        return chunk_backward(q, k, v, G, beta, S, do, dS_next, seg, **rule)[:5]

    dq, dk, dv, dG, dbeta = _call(
        grads, [(q, "qk"), (k, "qk"), (v, "v"), (G, "row"), (beta, "row"), (seg, "seg"),
                (states, "state"), (do, "v"), (dS_next, "state")],
        [((B, H, T, K), F32, "hk"), ((B, H, T, K), F32, "hk"), (v.shape, F32, "v"),
         (G.shape, F32, "row"), (G.shape, F32, "row")], **chunked)
    return dq, dk, dv, dG, dbeta, dh0
