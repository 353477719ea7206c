"""The `kernels` dimension: which implementation a training step runs (ARCHITECTURE.md
"Kernels: reference and fused").

    reference  this project's own torch / JAX code: the ground truth every check compares to
    fused      what a training team runs: library kernels (fla-core's chunk_gated_delta_rule,
               SDPA's flash backend, cuDNN or splash attention), composed with our CP exchanges

A fused point that a kernel cannot serve (dtype, chunk size, head dim, backend missing) raises
KernelUnavailable with the reason, and the trial is recorded `skipped` with it: a fused trial
never falls back to the reference silently. Each result stores the resolved implementation of
the GDN rule and of attention (ResolvedKernels), with versions.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

Kernels = Literal["reference", "fused"]
KERNELS: tuple[str, ...] = get_args(Kernels)
DEFAULT_KERNELS: Kernels = "reference"


def check_kernels(kernels: str) -> None:
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r} is not one of: {', '.join(KERNELS)}")


class KernelUnavailable(RuntimeError):
    """A fused kernel cannot serve this point; str(error) is the reason a skipped trial
    records (what was asked, what the kernel accepts)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedKernels:
    """The implementations a step really runs, named with their versions (stored per result)."""

    gdn: str
    """The GDN rule, e.g. "reference jax chunk rule" or "fla-core 0.6.0 chunk_gated_delta_rule"."""
    attention: str | None
    """The full-attention layers' kernel, e.g. "torch 2.13.0 sdpa flash"; None without
    attention layers (a gdn_only model)."""
