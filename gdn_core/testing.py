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
