"""Measured efficiencies of published runs: what the planner's roofline estimate assumes a chip
achieves where this database has no trial of it (roofline.py).

Here rather than in gdn_core.datasheets: an MFU is not a property of a chip but of a workload
run on it (this model family, under context parallelism, at this length, with that software),
so it is evidence a plan rests on, cited like a trial, and it grows as runs are published. The
planner is its only reader.

One table, PUBLISHED_RUNS: each run with its chip, dtype, MFU, throughput and citation. A
chip type with a published run is estimated at that run's MFU; any other at DEFAULT_MFU, a
documented range (DEFAULT_RANGE) whose centre is the published GDN run's own MFU, carried over
to a chip nobody has measured, since no other GDN context-parallel run has been published.
"""

from __future__ import annotations

import dataclasses

from gdn_core import datasheets
from service.schemas.planner import Efficiency


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PublishedRun:
    """One published training run: the chip, what ran, and what it measured."""

    who: str
    chip: str
    """Canonical accelerator type (gdn_core.datasheets)."""
    dtype: str
    chips: int
    seq_len: int
    tokens_per_s_per_chip: float
    mfu: float
    """As published, in the publisher's FLOP convention."""
    model: str
    source: str


MAXTEXT_GDN_CP = PublishedRun(
    who="MaxText", chip="v5p", dtype="bfloat16", chips=64, seq_len=1_048_576,
    tokens_per_s_per_chip=513.0, mfu=0.276,
    model="a Qwen3.5 Gated DeltaNet hybrid (the PR names no size; 513 tokens/s/chip at 27.6% "
          "MFU matches qwen3.5-9b's hybrid model FLOPs here within 3%: 28.4% at 513)",
    source="MaxText PR 'Shard the GatedDeltaNet sequence under ici_context_parallelism' by "
           "WandLZhang (fixes AI-Hypercomputer/maxtext#4932): 'Measured at 1,048,576 tokens "
           "on 64 v5p chips: 513 tokens/s/chip, 27.6% MFU' (GDN layers on the XLA scan: "
           "use_pallas is forced off under a context axis)")

PUBLISHED_RUNS: tuple[PublishedRun, ...] = (MAXTEXT_GDN_CP,)
"""Every published run the planner may rest an estimate on (one per chip type and dtype)."""

DEFAULT_MFU = MAXTEXT_GDN_CP.mfu
DEFAULT_RANGE = (0.138, 0.38)
DEFAULT_SOURCE = (
    "no published run on this chip: the default, MaxText's 27.6% (the only published GDN "
    "context-parallel measurement, v5p) carried over; range 13.8%–38%: low, half of it "
    "(assumed: a first run on an untuned stack), high, Llama 3 405B at 131,072 tokens with "
    "context parallelism 16 on H100 (380 TFLOP/s per GPU, 38% BF16 MFU; 'The Llama 3 Herd of "
    "Models', arXiv 2407.21783, Table 4) — a mature dense-attention stack, which no GDN run "
    "under CP has been shown to reach")

FLOAT32_PASSES_ON_TPU = 6
"""float32 matmuls at Precision.HIGHEST on a TPU run as about six bf16 MXU passes (JAX's
'bfloat16_6x'), and MFU of a float32 TPU run is taken against the bf16 peak
(gdn_core.datasheets.peak_dtype): a bf16 run's efficiency is divided by this for one."""


def efficiency_for(accelerator: str, dtype: str) -> Efficiency | None:
    """The efficiency a roofline estimate on `accelerator` (canonical, as CapacityRequest has
    it) assumes for a `dtype` run: the published run on that chip type, else DEFAULT_MFU and
    its range; None for virtual CPU chips (no datasheet peak, no published run)."""
    if accelerator == "cpu":
        return None
    run = next((r for r in PUBLISHED_RUNS if r.chip == accelerator), None)
    tpu_float32 = dtype == "float32" and datasheets.peak_dtype(accelerator, dtype) != dtype
    scale = 1 / FLOAT32_PASSES_ON_TPU if tpu_float32 else 1.0
    why = (f"; ÷ {FLOAT32_PASSES_ON_TPU} for float32 on a TPU (HIGHEST runs about six bf16 "
           "passes, MFU taken against the bf16 peak)" if tpu_float32 else "")
    if dtype == "float32" and not tpu_float32:
        why = "; a bf16 run's efficiency applied to the FP32 peak (no float32 run published)"
    if run is not None:
        low, high = (min(DEFAULT_RANGE[0], run.mfu), max(DEFAULT_RANGE[1], run.mfu))
        return Efficiency(
            mfu=run.mfu * scale, low=low * scale, high=high * scale, published=True,
            label=f"{run.who}'s measured {100 * run.mfu * scale:.1f}% MFU on {run.chip}"
                  + (" (float32)" if scale != 1 else ""),
            source=f"{run.source}; range {100 * low:.1f}%–{100 * high:.0f}% as the default's"
                   + why)
    return Efficiency(
        mfu=DEFAULT_MFU * scale, low=DEFAULT_RANGE[0] * scale, high=DEFAULT_RANGE[1] * scale,
        published=False,
        label=f"the default {100 * DEFAULT_MFU * scale:.1f}% MFU (range "
              f"{100 * DEFAULT_RANGE[0] * scale:.1f}%–{100 * DEFAULT_RANGE[1] * scale:.0f}%; "
              f"no published run on {accelerator})",
        source=DEFAULT_SOURCE + why)


__all__ = ["DEFAULT_MFU", "DEFAULT_RANGE", "Efficiency", "MAXTEXT_GDN_CP", "PUBLISHED_RUNS",
           "PublishedRun", "efficiency_for"]
