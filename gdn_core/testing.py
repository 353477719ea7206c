"""Comparison helpers for tests and benchmarks (framework-agnostic: numpy, torch and jax arrays)."""

from __future__ import annotations

import numpy as np


def to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_err(ref, out, *, floor: float = 0.0) -> float:
    """‖out − ref‖ / max(‖ref‖, floor) (Frobenius), in float64; ‖out − ref‖ when both are 0.

    `floor` keeps round-off on a near-zero reference (e.g. dg under g ≈ −20, ~1e-9) from
    reading as a large relative error.
    """
    ref, out = to_numpy(ref), to_numpy(out)
    denom = max(float(np.linalg.norm(ref)), floor)
    diff = float(np.linalg.norm(out - ref))
    return diff / denom if denom > 0 else diff


def assert_close(name: str, ref, out, tol: float, *, floor: float = 0.0) -> None:
    """Fail with the name and the error when out differs from ref by more than tol (relative)."""
    ref_np, out_np = to_numpy(ref), to_numpy(out)
    assert ref_np.shape == out_np.shape, f"{name}: shape {out_np.shape} != reference {ref_np.shape}"
    assert np.isfinite(out_np).all(), f"{name}: non-finite values"
    err = rel_err(ref_np, out_np, floor=floor)
    assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.1e}"


VERIFY_GRAD_FLOOR = 1e-3
"""verify's error floor, × the norm of the whole reference gradient.

The A_log / dt_bias gradients of strongly decaying heads (A up to 16 at init) are ~1e-6 of the
total and carry fp32 round-off of ~1e-4 relative to themselves (one chip at chunk 32 vs 16
differs by 8e-4, more than CP does); the floor hides that round-off (~1e-9 absolute) while a
wrong gradient in any tensor whose norm exceeds 1e-7 of the total still reads as > 1e-4."""


def max_verify_error(ref_loss, out_loss, ref_grads, out_grads) -> float:
    """Max relative error of a loss and its gradients (sequences in the same order) vs reference.

    Each gradient's error is relative to max(its norm, VERIFY_GRAD_FLOOR × the norm of the
    whole reference gradient).
    """
    ref_grads = [to_numpy(g) for g in ref_grads]
    floor = VERIFY_GRAD_FLOOR * float(np.sqrt(sum(np.sum(g * g) for g in ref_grads)))
    return max([rel_err(ref_loss, out_loss)] + [rel_err(r, o, floor=floor)
                                                 for r, o in zip(ref_grads, out_grads)])
