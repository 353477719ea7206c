"""Numerics beside the kernel benchmark's timings (see gdn_core.bench.kernel).

- Accuracy on keys that share a direction, as a trained model's do: k = c·u + sqrt(1−c²)·n
  (u one unit direction per key head, n a unit Gaussian direction), L2-normalised, β ∈ U(0.5, 1),
  g = log U(0.95, 1); each implementation's output against the float64 token-by-token
  recurrence (gdn_core.reference).
- The JAX rule's triangular inverse against the product form it replaced,
  (I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)…(I + L^{C/2}), kept here only to measure the change
  (time and error on such keys): it loses all accuracy once keys share a direction.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np

from ..reference import recurrent_gated_delta_rule_float64

COSINE = 0.95
"""Cosine of the keys to their head's direction in the accuracy check (≈ 0.9 between keys)."""


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def correlated_inputs(*, batch, seq_len, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                      cosine=COSINE, seed=0) -> dict[str, np.ndarray]:
    """q, v, do standard normal; keys at `cosine` to one direction per head; float32."""
    rng = np.random.default_rng(seed)
    B, T = batch, seq_len
    u_HK = _unit(rng.standard_normal((num_k_heads, head_k_dim)))
    n_BTHK = _unit(rng.standard_normal((B, T, num_k_heads, head_k_dim)))
    arrays = dict(
        q=rng.standard_normal((B, T, num_k_heads, head_k_dim)),
        k=_unit(cosine * u_HK + np.sqrt(1 - cosine ** 2) * n_BTHK),
        v=rng.standard_normal((B, T, num_v_heads, head_v_dim)),
        g=np.log(rng.uniform(0.95, 1.0, (B, T, num_v_heads))),
        beta=rng.uniform(0.5, 1.0, (B, T, num_v_heads)),
        do=rng.standard_normal((B, T, num_v_heads, head_v_dim)),
    )
    return {name: a.astype(np.float32) for name, a in arrays.items()}


def float64_output(arrays) -> np.ndarray:
    """The float64 recurrence's output (l2norm on, no initial state), as the benchmark runs."""
    o, _ = recurrent_gated_delta_rule_float64(*(arrays[n] for n in ("q", "k", "v", "g", "beta")),
                                              use_qk_l2norm=True)
    return o


def product_form_unit_lower_inverse(L_CC):
    """The replaced inverse: (I − L)(I + L²)…(I + L^{C/2}) for strictly-lower L [..., C, C]."""
    import jax.numpy as jnp
    from jax.lax import Precision

    C = L_CC.shape[-1]
    inverse = jnp.eye(C, dtype=L_CC.dtype) - L_CC
    power = L_CC
    for _ in range(C.bit_length() - 2):  # L², L⁴, …, L^{C/2}
        power = jnp.matmul(power, power, precision=Precision.HIGHEST)
        inverse = inverse + jnp.matmul(inverse, power, precision=Precision.HIGHEST)
    return inverse


@contextlib.contextmanager
def product_form_inverse_in_jax_rule():
    """Trace the JAX rule with the product-form inverse inside this block (compile inside it)."""
    from ..jax_gdn import chunk

    blockwise = chunk.unit_lower_inverse
    chunk.unit_lower_inverse = product_form_unit_lower_inverse
    try:
        yield
    finally:
        chunk.unit_lower_inverse = blockwise


def correlated_L(*, blocks: int, chunk: int, dim: int, cosine=COSINE, seed=0) -> np.ndarray:
    """The rule's L = β (k kᵀ) e^{G_i−G_j}, strictly lower, for `blocks` chunks [blocks, C, C]."""
    rng = np.random.default_rng(seed)
    u = _unit(rng.standard_normal(dim))
    k_NCK = _unit(cosine * u + np.sqrt(1 - cosine ** 2) * _unit(
        rng.standard_normal((blocks, chunk, dim))))
    beta_NC = rng.uniform(0.5, 1.0, (blocks, chunk))
    G_NC = np.cumsum(np.log(rng.uniform(0.95, 1.0, (blocks, chunk))), axis=-1)
    decay_NCC = np.exp(np.tril(G_NC[:, :, None] - G_NC[:, None, :]))
    L = beta_NC[..., None] * (k_NCK @ np.swapaxes(k_NCK, -1, -2)) * decay_NCC
    return np.tril(L, -1).astype(np.float32)


def compare_inverses(*, blocks=256, chunk=64, dim=128, repeats=20) -> list[dict]:
    """Median forward and forward+backward time and float64-relative error of both inverses."""
    import jax
    import jax.numpy as jnp

    from ..jax_gdn.chunk import unit_lower_inverse
    from ..testing import rel_err

    L_np = correlated_L(blocks=blocks, chunk=chunk, dim=dim)
    exact = np.linalg.inv(np.eye(chunk) + L_np.astype(np.float64))
    L = jnp.asarray(L_np)
    W = jnp.asarray(np.random.default_rng(1).standard_normal(L_np.shape), jnp.float32)
    rows = []
    for name, inverse in (("product form", product_form_unit_lower_inverse),
                          ("blockwise", unit_lower_inverse)):
        forward = jax.jit(inverse)
        backward = jax.jit(jax.grad(lambda L: jnp.sum(inverse(L) * W)))
        T = jax.block_until_ready(forward(L))
        jax.block_until_ready(backward(L))
        times = {"fwd": [], "fwd+bwd": []}
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(forward(L))
            times["fwd"].append(time.perf_counter() - start)
            start = time.perf_counter()
            jax.block_until_ready(backward(L))
            times["fwd+bwd"].append(time.perf_counter() - start)
        rows.append(dict(name=name, error=rel_err(exact, T),
                         **{k: statistics.median(v) for k, v in times.items()}))
    return rows


def print_inverse_comparison(rows, *, blocks=256, chunk=64, cosine=COSINE) -> None:
    print(f"\nJAX (I+L)^-1 alone, {blocks} blocks of {chunk}, keys at cosine {cosine} "
          "(median; error vs float64 inverse)")
    print(f"{'inverse':<14}{'fwd ms':>9}{'fwd+bwd ms':>12}{'rel err':>10}")
    for row in rows:
        print(f"{row['name']:<14}{row['fwd'] * 1e3:>9.2f}{row['fwd+bwd'] * 1e3:>12.2f}"
              f"{row['error']:>10.1e}")
    old, new = rows
    print(f"time ratio product form / blockwise: fwd {old['fwd'] / new['fwd']:.2f}x, "
          f"fwd+bwd {old['fwd+bwd'] / new['fwd+bwd']:.2f}x")
