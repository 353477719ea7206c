"""Random inputs for the gated delta rule, shared by the rule tests (numpy, float32).

Keys are drawn as a trained model's are by default: the keys of one head share a direction,
k = c·u + sqrt(1−c²)·n with u one fixed unit direction per key head and n a unit Gaussian
direction, then L2-normalised (cosine ≈ c to u, ≈ c² between two keys), with β ∈ U(0.5, 1).
These are the inputs on which a chunked rule with an ill-conditioned triangular inverse fails
(the product-form inverse reached a relative error of 1e5 at c = 0.8); i.i.d. Gaussian keys
with β ∈ U(0, 1) (`keys="iid"`) are kept for a share of the cases.
"""

from __future__ import annotations

import dataclasses

import numpy as np

KEYS = ("correlated", "iid")
DECAYS = ("mixed", "weak", "zero", "strong")


@dataclasses.dataclass(frozen=True)
class RuleCase:
    B: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    # "mixed" g = log U(0.8, 1), "weak" g = log U(0.95, 1), "zero" g = 0,
    # "strong" g ≈ −20 per token (a near-reset)
    decay: str = "mixed"
    chunk_size: int = 64
    keys: str = "correlated"  # "correlated" (cosine `cosine` to a head direction) or "iid"
    cosine: float = 0.9

    def __post_init__(self):
        if self.decay not in DECAYS:
            raise ValueError(f"decay={self.decay!r} is not one of {DECAYS}")
        if self.keys not in KEYS:
            raise ValueError(f"keys={self.keys!r} is not one of {KEYS}")
        if not 0.0 <= self.cosine < 1.0:
            raise ValueError(f"cosine={self.cosine} must be in [0, 1)")

    @property
    def id(self) -> str:
        keys = f"corr{self.cosine:g}" if self.keys == "correlated" else "iid"
        return (f"B{self.B}-T{self.T}-Hk{self.Hk}-Hv{self.Hv}-Dk{self.Dk}-Dv{self.Dv}"
                f"-{self.decay}-C{self.chunk_size}-{keys}")


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def correlated_keys(rng, B, T, Hk, Dk, cosine) -> np.ndarray:
    """Unit keys [B, T, Hk, Dk] at cosine ≈ `cosine` to one direction per key head."""
    u_HK = unit(rng.standard_normal((Hk, Dk)))
    n_BTHK = unit(rng.standard_normal((B, T, Hk, Dk)))
    return unit(cosine * u_HK + np.sqrt(1.0 - cosine ** 2) * n_BTHK)


def log_decay(rng, decay: str, shape) -> np.ndarray:
    if decay == "zero":
        return np.zeros(shape)
    if decay == "strong":
        return -20.0 + rng.uniform(-1, 1, shape)
    low = 0.95 if decay == "weak" else 0.8
    return np.log(rng.uniform(low, 1.0, shape))


def make_inputs(case: RuleCase, seed: int = 0) -> dict[str, np.ndarray]:
    """q, k, v, g, beta and an initial state (float32 numpy); keys as `case.keys` says."""
    rng = np.random.default_rng(seed)
    B, T, Hk, Hv, Dk, Dv = case.B, case.T, case.Hk, case.Hv, case.Dk, case.Dv
    if case.keys == "correlated":
        k = correlated_keys(rng, B, T, Hk, Dk, case.cosine)
        beta = rng.uniform(0.5, 1.0, (B, T, Hv))
    else:
        k = rng.standard_normal((B, T, Hk, Dk))
        beta = rng.uniform(0.0, 1.0, (B, T, Hv))
    arrays = dict(
        q=rng.standard_normal((B, T, Hk, Dk)),
        k=k,
        v=rng.standard_normal((B, T, Hv, Dv)),
        g=log_decay(rng, case.decay, (B, T, Hv)),
        beta=beta,
        initial_state=0.1 * rng.standard_normal((B, Hv, Dk, Dv)),
    )
    return {name: a.astype(np.float32) for name, a in arrays.items()}


RULE_CASES = [
    RuleCase(1, 1, 1, 1, 16, 16),
    RuleCase(2, 63, 2, 2, 32, 16, "zero", keys="iid"),
    RuleCase(1, 100, 2, 4, 16, 32, "strong"),
    RuleCase(2, 256, 1, 4, 32, 32, keys="iid"),
    RuleCase(1, 200, 2, 4, 32, 16, "weak", 16, cosine=0.97),
    RuleCase(1, 512, 4, 4, 16, 16, "mixed", 128, keys="iid"),
]
