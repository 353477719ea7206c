"""pallas_call builders of the chunk rule: forward and backward on TPU (GPU: gpu_kernels.py).

Arrays as the kernels see them (chunk_rule.py lays them out; N chunks of C tokens, T = N·C):
    q, k [B, G, T, K] (input dtype)   v [B, H, T, V] (input dtype)
    G, β [B, H, N, 1, C] float32 (G: cumulative log decay inside each chunk)
    seg  [B, N, 1, C] float32 (packed documents only: documents begun inside the chunk so far)
    h0, final, dfinal, dh0 [B, H, K, V] float32    states [B, H, N, K, V] float32 (S entering
    each chunk, the backward's residual)           o [B, H, T, V] (q's dtype)
Value head h reads key head h // (H/G) (index maps; nothing is repeated in memory). The
backward returns dq, dk per VALUE head [B, H, T, K] float32 (summed over a key head's group by
the caller), dv [B, H, T, V], dG, dβ [B, H, N, 1, C], dh0, all float32.

TPU: grid (B, H, N), the chunk axis last and sequential, the state (backward: its cotangent)
carried in VMEM scratch; the backward walks the chunks in reverse through its index maps.
GPU: chunk-parallel calls around sequential state passes (gpu_kernels.py); forward_call and
backward_call dispatch there. The chunk's math is chunk_math's, shared by both.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import gpu_kernels
from .blocks import BlockPlan, check_tpu_tiling
from .chunk_math import F32, chunk_backward, chunk_forward

RULE = dict
"""The rule's keyword arguments for chunk_math: use_qk_l2norm, low (the output dots' dtype)."""


def _unpack(refs, names):
    """Name a kernel's refs; a name ending in '?' is an absent optional array (None)."""
    named, it = {}, iter(refs)
    for name in names:
        named[name.rstrip("?")] = None if name.endswith("?") else next(it)
    return named


def _read(ref):
    return None if ref is None else ref[...]


# --- TPU: one grid step per chunk ----------------------------------------------------------------

def _tpu_specs(shapes, group: int, reverse: bool, N: int):
    """BlockSpecs over grid (b, h, n) for the named arrays; chunk m = n, or N−1−n in reverse."""
    chunk = (lambda n: N - 1 - n) if reverse else (lambda n: n)
    C, K, V = shapes["C"], shapes["K"], shapes["V"]
    return {
        "qk": pl.BlockSpec((None, None, C, K), lambda b, h, n: (b, lax.div(h, group), chunk(n), 0)),
        "dqk": pl.BlockSpec((None, None, C, K), lambda b, h, n: (b, h, chunk(n), 0)),
        "v": pl.BlockSpec((None, None, C, V), lambda b, h, n: (b, h, chunk(n), 0)),
        "row": pl.BlockSpec((None, None, None, 1, C), lambda b, h, n: (b, h, chunk(n), 0, 0)),
        "seg": pl.BlockSpec((None, None, 1, C), lambda b, h, n: (b, chunk(n), 0, 0)),
        "state": pl.BlockSpec((None, None, K, V), lambda b, h, n: (b, h, 0, 0)),
        "states": pl.BlockSpec((None, None, None, K, V), lambda b, h, n: (b, h, chunk(n), 0, 0)),
    }


def _check_tpu_blocks(specs, keys, shapes):
    """TPU's tiling rule on every block of a call: its spec keys and array shapes in order."""
    check_tpu_tiling({f"{i}:{key}": (specs[key].block_shape, shape)
                      for i, (key, shape) in enumerate(zip(keys, shapes))})


def _tpu_call(kernel, grid, in_specs, out_specs, out_shape, scratch, interpret):
    return pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        scratch_shapes=scratch, interpret=interpret,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))


def _tpu_forward_kernel(*refs, names, N, store, rule):
    r = _unpack(refs, names)
    n, S_ref = pl.program_id(2), r["S"]

    @pl.when(n == 0)
    def _():
        S_ref[...] = r["h0"][...]

    S = S_ref[...]
    if store:
        r["states"][...] = S
    o, S_next = chunk_forward(r["q"][...], r["k"][...], r["v"][...], r["G"][...],
                              r["beta"][...], S, _read(r["seg"]), **rule)
    r["o"][...] = o.astype(r["o"].dtype)
    S_ref[...] = S_next

    @pl.when(n == N - 1)
    def _():
        r["final"][...] = S_next


def _tpu_backward_kernel(*refs, names, N, rule):
    r = _unpack(refs, names)
    n, dS_ref = pl.program_id(2), r["dS"]

    @pl.when(n == 0)
    def _():
        dS_ref[...] = r["dfinal"][...]

    dq, dk, dv, dG, dbeta, dS = chunk_backward(
        r["q"][...], r["k"][...], r["v"][...], r["G"][...], r["beta"][...], r["states"][...],
        r["do"][...], dS_ref[...], _read(r["seg"]), **rule)
    for name, value in (("dq", dq), ("dk", dk), ("dv", dv), ("dG", dG), ("dbeta", dbeta)):
        r[name][...] = value
    dS_ref[...] = dS

    @pl.when(n == N - 1)
    def _():
        r["dh0"][...] = dS


# --- the calls ---------------------------------------------------------------------------------

def _shapes(q, v, G):
    B, H, N, _, C = G.shape
    return dict(B=B, H=H, N=N, C=C, T=N * C, K=q.shape[-1], V=v.shape[-1])


def forward_call(plan: BlockPlan, q, k, v, G, beta, seg, h0, *, store_states: bool,
                 rule: RULE, interpret=False, check_tiling: bool = True):
    """(o [B,H,T,V] q's dtype, final [B,H,K,V] f32, states [B,H,N,K,V] f32 or None).

    check_tiling=False skips our TPU tiling check (a test's way to see Mosaic's own).
    On 'gpu' the residual is gpu_kernels.forward's (the states and w)."""
    if plan.platform == "gpu":
        return gpu_kernels.forward(plan, q, k, v, G, beta, seg, h0, store_states=store_states,
                                   rule=rule, interpret=interpret)
    s = _shapes(q, v, G)
    B, H, N, K, V = (s[x] for x in "BHNKV")
    group = H // q.shape[1]
    names = ["q", "k", "v", "G", "beta", "seg" if seg is not None else "seg?", "h0",
             "o", "final", "states" if store_states else "states?"]
    inputs = [x for x in (q, k, v, G, beta, seg, h0) if x is not None]
    out_shape = [jax.ShapeDtypeStruct(v.shape, q.dtype), jax.ShapeDtypeStruct(h0.shape, F32)]
    if store_states:
        out_shape.append(jax.ShapeDtypeStruct((B, H, N, K, V), F32))
    specs = _tpu_specs(s, group, False, N)
    in_keys = ["qk", "qk", "v", "row", "row"] + (["seg"] if seg is not None else []) + ["state"]
    out_keys = ["v", "state"] + (["states"] if store_states else [])
    if check_tiling:
        _check_tpu_blocks(specs, in_keys + out_keys,
                          [x.shape for x in inputs] + [o.shape for o in out_shape])
    kernel = functools.partial(_tpu_forward_kernel, names=names + ["S"], N=N,
                               store=store_states, rule=rule)
    call = _tpu_call(kernel, (B, H, N), [specs[x] for x in in_keys],
                     [specs[x] for x in out_keys], out_shape, [pltpu.VMEM((K, V), F32)],
                     interpret)
    outs = call(*inputs)
    return outs[0], outs[1], (outs[2] if store_states else None)


def backward_call(plan: BlockPlan, q, k, v, G, beta, seg, residual, do, dfinal, *, rule: RULE,
                  interpret=False):
    """(dq, dk per value head, dv, dG, dβ, dh0), all float32 (module docstring); residual:
    forward_call's."""
    if plan.platform == "gpu":
        return gpu_kernels.backward(plan, q, k, v, G, beta, seg, residual, do, dfinal,
                                    rule=rule, interpret=interpret)
    states = residual
    s = _shapes(q, v, G)
    B, H, N, T, K = (s[x] for x in "BHNTK")
    group = H // q.shape[1]
    names = ["q", "k", "v", "G", "beta", "seg" if seg is not None else "seg?", "states", "do",
             "dfinal", "dq", "dk", "dv", "dG", "dbeta", "dh0"]
    inputs = [x for x in (q, k, v, G, beta, seg, states, do, dfinal) if x is not None]
    out_shape = [jax.ShapeDtypeStruct((B, H, T, K), F32)] * 2 + [
        jax.ShapeDtypeStruct(v.shape, F32), jax.ShapeDtypeStruct(G.shape, F32),
        jax.ShapeDtypeStruct(G.shape, F32), jax.ShapeDtypeStruct(dfinal.shape, F32)]
    in_keys = (["qk", "qk", "v", "row", "row"] + (["seg"] if seg is not None else [])
               + ["states", "v", "state"])
    out_keys = ["dqk", "dqk", "v", "row", "row", "state"]
    specs = _tpu_specs(s, group, True, N)
    _check_tpu_blocks(specs, in_keys + out_keys,
                      [x.shape for x in inputs] + [o.shape for o in out_shape])
    kernel = functools.partial(_tpu_backward_kernel, names=names + ["dS"], N=N, rule=rule)
    call = _tpu_call(kernel, (B, H, N), [specs[x] for x in in_keys],
                     [specs[x] for x in out_keys], out_shape,
                     [pltpu.VMEM(dfinal.shape[-2:], F32)], interpret)
    return tuple(call(*inputs))
