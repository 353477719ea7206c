"""Comparison helpers for tests and benchmarks (framework-agnostic: numpy, torch and jax arrays)."""

from __future__ import annotations

import numpy as np


def to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_err(ref, out) -> float:
    """‖out − ref‖ / ‖ref‖ (Frobenius), in float64; 0 when both are zero."""
    ref, out = to_numpy(ref), to_numpy(out)
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(out - ref)
    return float(diff / denom) if denom > 0 else float(diff)


def assert_close(name: str, ref, out, tol: float) -> None:
    """Fail with the name and both errors when out differs from ref by more than tol (relative)."""
    ref_np, out_np = to_numpy(ref), to_numpy(out)
    assert ref_np.shape == out_np.shape, f"{name}: shape {out_np.shape} != reference {ref_np.shape}"
    assert np.isfinite(out_np).all(), f"{name}: non-finite values"
    err = rel_err(ref_np, out_np)
    assert err <= tol, f"{name}: relative error {err:.3e} > tolerance {tol:.1e}"
