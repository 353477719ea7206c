"""A candidate's figures as the answer carries them, and the choices among candidates: the
Pareto front, the dominated attn_cp / layout variants left out, plans beside measured trials."""

from __future__ import annotations

from collections.abc import Sequence

from gdn_core import datasheets
from gdn_core.cp_modes import trial_mode
from gdn_core.interpreted_kernels import INTERPRET_ENV, interpreted
from gdn_core.kernels import JAX_PALLAS_GDN, REFERENCE_GDN
from service.planner.cached import model_flops
from service.planner.evidence import Observation
from service.planner.points import Point
from service.schemas.planner import CapacityRequest, Candidate, Figure, PlanCheck
from workers.memory_admission import chip_memory_bytes
from workers.sweep_spec import AcceleratorSpec

SECONDS_PER_HOUR = 3600
BILLION_TOKENS = 10 ** 9


UNMEASURED_NOTE = ("unmeasured: no measured (non-interpreted) trial of the Pallas chunk rule "
                   "yet, so this step time is not the kernel's own")
"""A fused JAX candidate's step-time note until a chip has measured the Pallas rule."""


def accelerator_kind(accelerator: str) -> str:
    """cpu, tpu (the TPU types of gdn_core.datasheets, v4 … v6e) or gpu."""
    if accelerator == "cpu":
        return "cpu"
    try:
        name = datasheets.canonical_accelerator_type(accelerator)
    except ValueError:
        return "gpu"
    return "tpu" if name.startswith("v") else "gpu"


def gdn_kernel_label(framework: str, kernels: str, accelerator: str) -> str:
    """What a candidate's GDN layers run on `accelerator` chips (gdn_core.kernels' names, no
    versions: a plan spans installs). JAX's fused GDN: the Pallas chunk rule for the chip's
    platform; on CPU chips it runs only interpreted."""
    if kernels == "reference":
        return REFERENCE_GDN[framework]
    if framework == "jax":
        kind = accelerator_kind(accelerator)
        if kind == "cpu":
            return f"{interpreted(JAX_PALLAS_GDN)}, only under {INTERPRET_ENV}=1"
        return f"{JAX_PALLAS_GDN} ({kind})"
    return ("fla-core chunk_gated_delta_rule (not built under context parallelism yet: "
            "fused torch trials are skipped, so no trial rests on it)")


def chip_memory(request: CapacityRequest, chips: int) -> tuple[int, str]:
    """Memory of one chip and what it is: given, the chip type's HBM, or (CPU chips) this
    host's RAM shared by the chips, as admission counts it."""
    if request.chip_memory_bytes is not None:
        return request.chip_memory_bytes, "given (chip_memory_bytes)"
    if request.accelerator == "cpu":
        total, what = chip_memory_bytes(AcceleratorSpec(kind="cpu", type="cpu"), chips)
        return total or 0, what
    return (datasheets.hbm_bytes_per_chip(request.accelerator),
            f"{request.accelerator} HBM per chip (gdn_core.datasheets)")


def make_candidate(request: CapacityRequest, model_cfg, point: Point, *, peak: float | None,
                   local: int, memory: Figure, capacity: int, step: Figure, comm: Figure
                   ) -> Candidate:
    """The candidate of `point`: its throughput, MFU and chip-hours from its step time (an
    MFU over 1 refuses them all: no chip runs above its peak)."""
    fits = memory.value is not None and memory.value <= capacity
    unmeasured = point.framework == "jax" and request.kernels == "fused" and not step.trial_ids
    if unmeasured:
        step = step.model_copy(update={"note": "; ".join(filter(None, (UNMEASURED_NOTE,
                                                                       step.note)))})
    tokens = point.dp * request.batch_size * request.seq_len  # every replica's sequences
    per_chip = total = mfu = hours = Figure(value=None, basis=step.basis, note=step.note)
    if step.value:
        ids = step.trial_ids
        per_chip = Figure(value=tokens / step.value / point.chips, basis=step.basis,
                          trial_ids=ids)
        total = Figure(value=tokens / step.value, basis=step.basis, trial_ids=ids)
        hours = Figure(value=BILLION_TOKENS / (per_chip.value * SECONDS_PER_HOUR),
                       basis=step.basis, trial_ids=ids)
        flops = model_flops(model_cfg, batch=point.dp * request.batch_size,
                            seq_len=request.seq_len)
        value = flops / (step.value * point.chips * peak) if peak else None
        if value is not None and value > 1:
            mfu = Figure(value=None, basis="refused", trial_ids=ids,
                         note=f"the fits predict MFU {value:.2f} > 1, which no chip reaches: "
                              "the prediction is wrong here (too far from the trials)")
            per_chip = total = hours = Figure(value=None, basis="refused", note=mfu.note)
        else:
            mfu = Figure(value=value, basis=step.basis, trial_ids=ids,
                         note="" if peak else "no peak FLOP/s known for this chip")
    return Candidate(framework=point.framework, kernels=request.kernels,
                     gdn_kernel=gdn_kernel_label(point.framework, request.kernels,
                                                 request.accelerator),
                     gdn_kernel_unmeasured=unmeasured,
                     mode=trial_mode(point.mode, cp_chips=point.cp_chips),
                     chips=point.chips, dp=point.dp, cp_chips=point.cp_chips,
                     global_batch_size=point.dp * request.batch_size,
                     param_sharding=point.param_sharding, remat=point.remat,
                     layers=point.layers, attn_cp=point.attn_cp, layout=point.layout,
                     local_tokens=local, fits=fits, memory_bytes_per_chip=memory,
                     chip_memory_bytes=capacity, step_time_s=step,
                     tokens_per_s_per_chip=per_chip, tokens_per_s=total, mfu=mfu,
                     comm_bytes_per_step_per_chip=comm, chip_hours_per_billion_tokens=hours)


def _variant_key(c: Candidate) -> tuple[float, float, float]:
    """Lower is better: fits first, then memory per chip, then step time (none: last)."""
    memory = c.memory_bytes_per_chip.value
    return (not c.fits, float("inf") if memory is None else memory,
            float("inf") if c.step_time_s.value is None else c.step_time_s.value)


def drop_dominated_variants(candidates: Sequence[Candidate]) -> tuple[list[Candidate], int]:
    """(kept, how many left out): among candidates alike but for attn_cp and layout, those
    another is no worse than on fitting, memory and step time (better in one, or equal and
    listed first) are left out."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault((c.framework, c.mode, c.chips, c.dp, c.param_sharding, c.remat,
                           c.layers), []).append(c)
    kept = []
    for group in groups.values():
        keys = [_variant_key(c) for c in group]
        for i, (c, k) in enumerate(zip(group, keys)):
            if not any(all(x <= y for x, y in zip(other, k)) and (other != k or j < i)
                       for j, other in enumerate(keys) if j != i):
                kept.append(c)
    return kept, len(candidates) - len(kept)


def pareto_frontier(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Those no other candidate beats on chips × total tokens/s × memory per chip (no more
    chips, no less throughput, no more memory, and better in one), by chips."""
    def key(c: Candidate) -> tuple[float, float, float]:
        return c.chips, -c.tokens_per_s.value, c.memory_bytes_per_chip.value

    def beats(a, b) -> bool:
        return all(x <= y for x, y in zip(a, b)) and a != b

    keyed = [(key(c), c) for c in candidates]
    return [c for k, c in sorted(keyed, key=lambda kc: kc[0])
            if not any(beats(other, k) for other, _ in keyed)]


def plan_checks(observations: Sequence[Observation]) -> list[PlanCheck]:
    """Every plan with a measured trial of the same point (its peak measured)."""
    measured = {(o.settings(), o.mode, o.chips, o.seq_len): o for o in observations
                if o.kind == "measure" and o.peak_memory_bytes}
    checks = []
    for plan in (o for o in observations if o.kind == "plan" and o.memory_bytes):
        twin = measured.get((plan.settings(), plan.mode, plan.chips, plan.seq_len))
        if twin is not None:
            checks.append(PlanCheck(
                point=f"{plan.framework}/{plan.mode}/chips={plan.chips}/seq_len={plan.seq_len}",
                plan_trial_id=plan.trial_id, measured_trial_id=twin.trial_id,
                plan_estimate_bytes=plan.memory_bytes, measured_peak_bytes=twin.peak_memory_bytes,
                measured_source=twin.peak_memory_source,
                ratio=plan.memory_bytes / twin.peak_memory_bytes))
    return checks


__all__ = ["UNMEASURED_NOTE", "accelerator_kind", "chip_memory", "drop_dominated_variants",
           "gdn_kernel_label", "make_candidate", "pareto_frontier", "plan_checks"]
