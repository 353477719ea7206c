"""The matmul every JAX layer projects with: a torch-layout Linear, its precision by dtype.

`linear(x, weight)` is x @ weightᵀ for a weight stored [out, in], accumulating in float32 and
returning x's dtype; its backward is written out so that both backward matmuls stay in the
compute dtype. The GDN layer, the attention layer and the model's MLP and LM head share it.
Legend: B batch, T tokens, I in features, O out features.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from .naive import HIGHEST


def precision(dtype):
    """HIGHEST for float32 (TPU/GPU would otherwise run bf16 passes or TF32); DEFAULT below."""
    return HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def _dot(a, b, spec: str, out_dtype):
    """einsum accumulating in float32, returned in out_dtype."""
    return jnp.einsum(spec, a, b, precision=precision(a.dtype),
                      preferred_element_type=jnp.float32).astype(out_dtype)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _linear(x_BTI, weight_OI, out_dtype):
    return _dot(x_BTI, weight_OI, "...i,oi->...o", out_dtype)


def _linear_fwd(x_BTI, weight_OI, out_dtype):
    return _linear(x_BTI, weight_OI, out_dtype), (x_BTI, weight_OI)


def _linear_bwd(out_dtype, residuals, dy_BTO):
    # Written out because JAX's own transpose of a dot with preferred_element_type=float32
    # upcasts both backward matmuls to float32×float32; here they stay in the compute dtype.
    del out_dtype
    x_BTI, weight_OI = residuals
    dy_BTO = dy_BTO.astype(x_BTI.dtype)
    return (_dot(dy_BTO, weight_OI, "...o,oi->...i", x_BTI.dtype),
            _dot(dy_BTO, x_BTI, "...o,...i->oi", weight_OI.dtype))


_linear.defvjp(_linear_fwd, _linear_bwd)


def linear(x_BTI, weight_OI, out_dtype=None):
    """x @ weightᵀ with a torch-layout weight [out, in], returned in out_dtype (default x's).

    The matmuls (forward and both backward ones) take x's dtype and accumulate in float32:
    bf16 inputs give bf16 dots, float32 ones run at HIGHEST precision.
    """
    out_dtype = x_BTI.dtype if out_dtype is None else jnp.dtype(out_dtype)
    return _linear(x_BTI, vary_like(weight_OI.astype(x_BTI.dtype), x_BTI), out_dtype)


def vary_like(weight, x):
    """weight, cast to vary over x's mesh axes under a shard_map with check_vma (a no-op
    elsewhere), so the custom backward's weight gradient has the weight's type and JAX's
    transpose of the cast sums it over those axes."""
    missing = varying_axes(x) - varying_axes(weight)
    return lax.pcast(weight, tuple(sorted(missing)), to="varying") if missing else weight


def varying_axes(x) -> frozenset:
    aval = jax.typeof(x)
    if hasattr(aval, "vma"):  # JAX releases that name it so
        return frozenset(aval.vma)
    return frozenset(getattr(getattr(aval, "manual_axis_type", None), "varying", ()))
