"""Random inputs for the gated delta rule, shared by the rule tests (numpy, float32)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RuleCase:
    B: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    decay: str = "mixed"  # "mixed" (moderate), "zero" (g = 0), "strong" (g ≈ −20 per token)
    chunk_size: int = 64

    @property
    def id(self) -> str:
        return f"B{self.B}-T{self.T}-Hk{self.Hk}-Hv{self.Hv}-Dk{self.Dk}-Dv{self.Dv}-{self.decay}-C{self.chunk_size}"


def make_inputs(case: RuleCase, seed: int = 0) -> dict[str, np.ndarray]:
    """q, k, v, g, beta and an initial state; keys are unit-scale so the rule is well conditioned."""
    rng = np.random.default_rng(seed)
    B, T, Hk, Hv, Dk, Dv = case.B, case.T, case.Hk, case.Hv, case.Dk, case.Dv
    if case.decay == "zero":
        g = np.zeros((B, T, Hv))
    elif case.decay == "strong":
        g = -20.0 + rng.uniform(-1, 1, (B, T, Hv))
    else:
        g = np.log(rng.uniform(0.8, 1.0, (B, T, Hv)))
    arrays = dict(
        q=rng.standard_normal((B, T, Hk, Dk)),
        k=rng.standard_normal((B, T, Hk, Dk)),
        v=rng.standard_normal((B, T, Hv, Dv)),
        g=g,
        beta=rng.uniform(0.0, 1.0, (B, T, Hv)),
        initial_state=0.1 * rng.standard_normal((B, Hv, Dk, Dv)),
    )
    return {name: a.astype(np.float32) for name, a in arrays.items()}


RULE_CASES = [
    RuleCase(1, 1, 1, 1, 16, 16),
    RuleCase(2, 63, 2, 2, 32, 16, "zero"),
    RuleCase(1, 100, 2, 4, 16, 32, "strong"),
    RuleCase(2, 256, 1, 4, 32, 32),
    RuleCase(1, 200, 2, 4, 32, 16, "mixed", 16),
    RuleCase(1, 512, 4, 4, 16, 16, "mixed", 128),
]
