"""The capacity planner: every (mesh, mode, settings) that fits a target, and how fast.

A mesh is dp data-parallel replicas × a CP group of chips / dp chips each (meshes.py: a
dp > 1 mesh is predicted from its replica, the dp = 1 candidate on chips / dp chips, which
everything below fits to dp = 1 trials).

For each candidate the memory per chip is gdn_core's predictor refined by the memory fit, the
step time the compute fit plus the mode's link fit over its bytes and rounds, and each figure
says what it rests on: `measured` (a trial of exactly this point), `interpolated` (inside the
fitted range), `extrapolated` (beyond it, up to EXTRAPOLATION_LIMIT) — past that the figure
is refused (None) with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence

from gdn_core import hardware
from gdn_core.cp_modes import check_cp_shape
from gdn_core.flops.hardware import hardware_flops_per_step
from gdn_core.flops.model import model_flops_per_step
from gdn_core.kernels import JAX_GDN_NOT_FUSED, REFERENCE_GDN, jax_fused_gdn_name
from gdn_core.memory.step import predict_step_memory
from gdn_core.train_config import (
    TrainConfig,
)
from service.planner.evidence import Observation, interpreted_caveat, say_left_out, split_speed
from service.planner.fits import (
    AffineFit,
    LinkFit,
    TimeCurve,
    dependent_rounds,
    fit_compute,
    fit_links,
    fit_memory,
    scaled_comm_bytes,
    time_curve,
)
from service.planner.meshes import mesh_comm_and_step, mesh_dps, mesh_memory
from service.planner.schemas import (
    Basis,
    Candidate,
    CapacityAnswer,
    CapacityRequest,
    Figure,
    PlanCheck,
)
from workers.memory_admission import chip_memory_bytes
from workers.sweep_spec import AcceleratorSpec

EXTRAPOLATION_LIMIT = 16
"""A fit is used at most this many times past the largest local shard (memory), per-chip
FLOPs (compute) or chip count (links) it was fitted on; beyond, the figure is refused."""

@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    framework: str
    mode: str
    chips: int
    """All chips of the mesh: dp × cp_chips."""
    param_sharding: str
    remat: str
    dp: int = 1

    @property
    def cp_chips(self) -> int:
        return self.chips // self.dp

    def replica(self) -> Point:
        """One replica of the mesh: the dp = 1 point on its CP chips."""
        return dataclasses.replace(self, chips=self.cp_chips, dp=1)


def _chip_counts(max_chips: int, observations: Sequence[Observation]) -> list[int]:
    powers = {2 ** i for i in range(int(math.log2(max_chips)) + 1)}
    return sorted(powers | {o.chips for o in observations if o.chips <= max_chips})


def _matches(o: Observation, request: CapacityRequest, point: Point, num_layers: int, *,
             any_dp: bool = False) -> bool:
    return (o.framework == point.framework and o.kernels == request.kernels
            and (any_dp or o.dp == point.dp) and o.dtype == request.dtype
            and o.batch_size == request.batch_size and o.num_layers == num_layers
            and o.param_sharding == point.param_sharding and o.remat == point.remat)


def _basis(x: float, x_max: float, x_min: float = 0.0) -> tuple[Basis, str]:
    if x_min <= x <= x_max:
        return "interpolated", ""
    if x <= EXTRAPOLATION_LIMIT * x_max:
        return "extrapolated", f"{x / x_max:.1f}× past the fitted range"
    return "refused", (f"{x / x_max:.0f}× past the largest fitted value ({x_max:.3g}); the "
                       f"planner extrapolates at most {EXTRAPOLATION_LIMIT}×: run or plan "
                       "trials nearer this size")


def predict_memory(request: CapacityRequest, model_cfg, point: Point,
                   group: Sequence[Observation], exact: Sequence[Observation]) -> Figure:
    """Memory per chip at request.seq_len: a trial of the point (measured, else a plan's
    estimate), else the analytic prediction refined by the memory fit of `group`."""
    train_cfg = TrainConfig(batch_size=request.batch_size, seq_len=request.seq_len,
                            dtype=request.dtype, param_sharding=point.param_sharding,
                            remat=point.remat)
    predicted = predict_step_memory(model_cfg, train_cfg, mode=point.mode, chips=point.cp_chips,
                                    dp=point.dp, framework=point.framework,
                                    kernels=request.kernels).total
    if model_cfg.moe is not None:
        exact = []  # its trials ran the dense stand-in: their memory is not the experts'
    peaks = [o for o in exact if o.memory_is_peak]
    if peaks:
        return Figure(value=max(o.memory_bytes for o in peaks), basis="measured",
                      trial_ids=[o.trial_id for o in peaks], note=peaks[0].memory_source)
    estimates = [o for o in exact if o.memory_bytes is not None]
    if estimates:
        return Figure(value=estimates[0].memory_bytes, basis="estimated",
                      trial_ids=[estimates[0].trial_id], note=estimates[0].memory_source)
    same_mode = [o for o in group if o.cp_mode == point.mode]
    measured_fit = _memory_fit([o for o in same_mode if o.memory_is_peak], point.chips)
    fit: AffineFit | None = measured_fit or _memory_fit(
        [o for o in same_mode if not o.memory_is_peak], point.chips)
    if fit is None:
        return Figure(value=predicted, basis="predicted",
                      note="gdn_core.memory.step.predict_step_memory; no trial to refine it")
    local = request.batch_size * request.seq_len / point.cp_chips
    basis, why = _basis(local, fit.x_max, fit.x_min)
    what = "measured peaks" if measured_fit else "XLA's estimates"
    if basis == "refused":  # keep the physics, drop the fitted slope
        return Figure(value=predicted + fit.intercept, basis="extrapolated",
                      trial_ids=list(fit.trial_ids),
                      note=f"analytic prediction + the fitted constant of {what} (the slope is "
                           f"not extrapolated {why.split(';')[0]})")
    moe = ("; MoE: the real experts' weights and AdamW state, the stand-in's fitted residual"
           if model_cfg.moe is not None else "")
    return Figure(value=predicted + fit(local), basis=basis, trial_ids=list(fit.trial_ids),
                  note=f"analytic prediction + residual fitted to {what}"
                       + (f"; {why}" if why else "") + moe)


def _memory_fit(rows: Sequence[Observation], chips: int) -> AffineFit | None:
    """The residual fit of the rows at this chip count when they span two shard lengths (what
    the predictor misses may differ by D), else pooled over every chip count."""
    at_chips = [o for o in rows if o.chips == chips]
    if len({o.local_tokens for o in at_chips}) >= 2:
        return fit_memory(at_chips)
    return fit_memory(rows)


def _comm(group, point: Point, local_tokens: int) -> tuple[Figure, float | None]:
    scaled = scaled_comm_bytes([o for o in group if o.cp_mode == point.mode or o.chips == 1],
                               mode=point.mode, chips=point.chips, local_tokens=local_tokens)
    if scaled is None:
        return Figure(value=None, basis="refused",
                      note=f"no trial recorded {point.mode}'s bytes for these settings: plan "
                           "one (kind: plan)"), None
    cp, sync, ids = scaled
    total = cp + sync
    exact = any(o.chips == point.chips and o.cp_mode == point.mode and o.trial_id in ids
                for o in group)
    return Figure(value=total, basis="measured" if exact or point.chips == 1 else
                  "interpolated", trial_ids=list(ids),
                  note="recorded bytes (HLO of the compiled step)" if exact else
                  "recorded bytes scaled to this chip count by the mode's growth in D"), total


def _step(request, model_cfg, point: Point, on_chip, exact, compute: TimeCurve | None,
          links: LinkFit, comm_bytes: float | None) -> Figure:
    """Step time: a trial of the point; else this mode's trials on as many chips at other
    lengths (their own curve: compute, contention and links together); else the one-chip
    compute curve plus the link model over the mode's bytes and rounds."""
    timed = [o for o in exact if o.kind == "measure" and o.step_time_s]
    if timed:
        return Figure(value=statistics.median(o.step_time_s for o in timed), basis="measured",
                      trial_ids=[o.trial_id for o in timed])
    per_chip = hardware_flops_per_step(
        model_cfg, mode=point.mode, chips=point.chips, batch=request.batch_size,
        seq_len=request.seq_len, framework=point.framework, remat=point.remat).total / point.chips
    same = time_curve([o for o in on_chip if o.chips == point.chips and o.cp_mode == point.mode])
    if same is not None and len(same.flops) >= 2:
        basis, why = _basis(per_chip, same.flops_max, same.flops_min)
        if basis != "refused":
            return Figure(value=same.seconds_at(per_chip), basis=basis,
                          trial_ids=list(same.trial_ids),
                          note=f"{point.mode} trials on {point.chips} chips at other lengths "
                               "(log-log in FLOPs per chip)" + (f"; {why}" if why else ""))
    if compute is None:
        return Figure(value=None, basis="refused", note="no one-chip measured trial of these "
                      "settings on this chip type: the achieved FLOP rate is unknown")
    if comm_bytes is None and point.chips > 1:
        return Figure(value=None, basis="refused", note="communication bytes unknown")
    basis, why = _basis(per_chip, compute.flops_max, compute.flops_min)
    if basis != "refused" and point.chips > max(links.chips_max, 1) * EXTRAPOLATION_LIMIT:
        basis, why = "refused", (f"{point.chips} chips is over {EXTRAPOLATION_LIMIT}× the "
                                 f"largest chip count the {point.mode} link fit saw")
    if basis == "refused":
        return Figure(value=None, basis="refused", note=why)
    if point.chips > max(links.chips_max, 1) and basis == "interpolated":
        basis, why = "extrapolated", f"beyond the {links.chips_max} chips the links were fitted on"
    seconds = compute.seconds_at(per_chip) + (links.seconds(comm_bytes, _rounds(point, model_cfg))
                                              if point.chips > 1 else 0.0)
    return Figure(value=seconds, basis=basis,
                  trial_ids=sorted({*compute.trial_ids, *links.trial_ids}),
                  note=f"compute at {compute.flops_per_s:.3g} FLOP/s per chip; links: "
                       f"{links.source}" + (f"; {why}" if why else ""))


def _rounds(point: Point, model_cfg) -> int:
    return dependent_rounds(point.mode, point.cp_chips, num_layers=model_cfg.num_layers,
                            remat=point.remat, dp=point.dp)


def _peak(request: CapacityRequest, group) -> float | None:
    if request.accelerator != "cpu":
        return hardware.peak_flops_per_chip(request.accelerator, request.dtype)
    peaks = [o.peak_flops_per_chip for o in group if o.peak_flops_per_chip]
    return statistics.median(peaks) if peaks else None


def plan_capacity(observations: Sequence[Observation], request: CapacityRequest
                  ) -> CapacityAnswer:
    """Every candidate (framework, mesh of chips ≤ max_chips, mode, param_sharding, remat) of
    the request, predicted from `observations` (load_observations), and the three picks."""
    model_cfg = request.model()
    observations, interpreted = split_speed(observations)
    interpreted = [o for o in interpreted if o.kernels == request.kernels
                   and o.framework in request.frameworks]
    candidates: list[Candidate] = []
    fitted: dict[tuple, tuple] = {}  # per step settings: the trials and the compute curve
    linked: dict[tuple, LinkFit] = {}  # per step settings and mode
    for point in _points(request, observations, model_cfg):
        capacity, _ = _chip_memory(request, point.chips)
        replica = point.replica()  # a dp > 1 mesh: its figures from its replica's
        settings = (point.framework, point.param_sharding, point.remat)
        if settings not in fitted:
            meshes = [o for o in observations if o.accelerator_type == request.accelerator
                      and _matches(o, request, replica, model_cfg.num_layers, any_dp=True)]
            group = [o for o in observations
                     if _matches(o, request, replica, model_cfg.num_layers)]
            on_chip = [o for o in group if o.accelerator_type == request.accelerator]
            fitted[settings] = group, on_chip, fit_compute(on_chip), meshes
        group, on_chip, compute, meshes = fitted[settings]
        if (settings, point.mode) not in linked:  # links: measured trials of every dp × cp
            linked[settings, point.mode] = fit_links(
                meshes, compute, accelerator_type=request.accelerator, mode=point.mode)
        links = linked[settings, point.mode]
        exact = [o for o in group if o.chips == replica.chips and o.seq_len == request.seq_len
                 and (o.cp_mode == point.mode)]
        local = request.batch_size * request.seq_len // point.cp_chips
        memory = predict_memory(request, model_cfg, replica, group, exact)
        comm, comm_bytes = _comm(group, replica, local)
        step = _step(request, model_cfg, replica, on_chip, exact, compute, links, comm_bytes)
        if point.dp > 1:
            memory, comm, step = _mesh_figures(request, model_cfg, point, observations, group,
                                               local, memory, comm, step, links)
        left_out = [o for o in interpreted
                    if _matches(o, request, replica, model_cfg.num_layers, any_dp=True)]
        if left_out:
            memory, step = say_left_out(left_out, memory, step)
        candidates.append(_candidate(request, model_cfg, point, group, local, memory, capacity,
                                     step, comm))
    fitting = [c for c in candidates if c.fits]
    timed = [c for c in fitting if c.tokens_per_s.value is not None]
    one_chip_memory, one_chip_source = _chip_memory(request, 1)
    caveats = [
        "A plan trial's memory is XLA:CPU's compile-time estimate: the program a TPU or GPU "
        "would run, with buffer sizes that differ by backend — compare it with a measured "
        "trial of the same point before trusting it to a few percent.",
        "Step times on a chip type come only from measured trials on that type; links without "
        "trials at several chip counts use the datasheet prior.",
    ]
    if "jax" in request.frameworks:
        caveats.append(f"JAX's GDN layers run the reference chunk rule under either kernels "
                       f"value {JAX_GDN_NOT_FUSED}: MaxText turns its Pallas kernel off under "
                       "context parallelism; kernels=fused changes only JAX's attention.")
    if interpreted:
        caveats.append(interpreted_caveat(interpreted))
    if model_cfg.moe is not None:
        caveats.append(f"MoE preset: memory counts the published model's experts and their "
                       f"AdamW state ({model_cfg.moe.source}); step time, FLOPs and MFU are the "
                       "dense stand-in's (as wide as the experts one token uses), which is what "
                       "the trials ran — not routed experts.")
    return CapacityAnswer(
        request=request, chip_memory_bytes=one_chip_memory, chip_memory_source=(
            one_chip_source + ("; CPU chips share it: each candidate has its own "
                               "chip_memory_bytes" if request.accelerator == "cpu" else "")),
        model_note=model_cfg.note,
        candidates=sorted(candidates, key=lambda c: (not c.fits, -(c.tokens_per_s.value or 0),
                                                     c.chips)),
        fewest_chips=min(fitting, key=lambda c: (c.chips, -(c.tokens_per_s.value or 0)),
                         default=None),
        cheapest=max(timed, key=lambda c: c.tokens_per_s_per_chip.value, default=None),
        fastest=max(timed, key=lambda c: c.tokens_per_s.value, default=None),
        pareto=pareto_frontier(timed), plan_checks=plan_checks(observations),
        evidence_trials=len(observations), caveats=caveats)


def _mesh_figures(request, model_cfg, point: Point, observations, group, local: int,
                  memory: Figure, comm: Figure, step: Figure, links: LinkFit):
    """(memory, comm, step) of a dp > 1 mesh: a trial of exactly it where there is one (a
    measured trial: all three; a plan: its XLA estimate of memory, labelled `estimated` as
    any plan's, and its compiled bytes), else its replica's figures moved by what dp changes
    (meshes.py)."""
    exact = [o for o in observations if _matches(o, request, point, model_cfg.num_layers)
             and o.chips == point.chips and o.seq_len == request.seq_len
             and o.cp_mode == point.mode]
    comm, mesh_step = mesh_comm_and_step(
        group=group, mode=point.mode, modes=request.modes, cp=point.cp_chips, dp=point.dp,
        local_tokens=local, replica_comm=comm, replica_step=step, links=links, recorded=exact,
        extra_rounds=_rounds(point, model_cfg) - _rounds(point.replica(), model_cfg))
    if any(o.memory_bytes is not None for o in exact):
        memory = predict_memory(request, model_cfg, point, [], exact)
    else:
        memory = mesh_memory(request, model_cfg, framework=point.framework, mode=point.mode,
                             cp=point.cp_chips, dp=point.dp, param_sharding=point.param_sharding,
                             remat=point.remat, replica=memory)
    timed = [o for o in exact if o.kind == "measure" and o.step_time_s]
    if timed:
        return memory, comm, Figure(value=statistics.median(o.step_time_s for o in timed),
                                    basis="measured", trial_ids=[o.trial_id for o in timed])
    return memory, comm, mesh_step


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


def gdn_kernel_label(framework: str, kernels: str) -> str:
    """What a candidate's GDN layers run (gdn_core.kernels' names, no versions: a plan spans
    installs). JAX has no fused GDN under CP: the reference, labelled so."""
    if kernels == "reference":
        return REFERENCE_GDN[framework]
    if framework == "jax":
        return jax_fused_gdn_name()
    return ("fla-core chunk_gated_delta_rule (not built under context parallelism yet: "
            "fused torch trials are skipped, so no trial rests on it)")


def _chip_memory(request: CapacityRequest, chips: int) -> tuple[int, str]:
    """Memory of one chip and what it is: given, the chip type's HBM, or (CPU chips) this
    host's RAM shared by the chips, as admission counts it."""
    if request.chip_memory_bytes is not None:
        return request.chip_memory_bytes, "given (chip_memory_bytes)"
    if request.accelerator == "cpu":
        total, what = chip_memory_bytes(AcceleratorSpec(kind="cpu", type="cpu"), chips)
        return total or 0, what
    return (hardware.hbm_bytes_per_chip(request.accelerator),
            f"{request.accelerator} HBM per chip (gdn_core.hardware datasheet)")


def _points(request: CapacityRequest, observations, model_cfg):
    gdn = model_cfg.gdn
    for chips in _chip_counts(request.max_chips, observations):
        for dp, framework in itertools.product(mesh_dps(chips, request.dp), request.frameworks):
            cp = chips // dp
            for mode in (["p2p"] if cp == 1 else request.modes):
                try:
                    check_cp_shape(mode=mode, chips=cp, seq_len=request.seq_len,
                                   num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                                   conv_kernel_size=gdn.conv_kernel_size)
                except ValueError:
                    continue
                for param_sharding in (["replicated"] if chips == 1
                                       else request.param_shardings):
                    for remat in request.remats:
                        yield Point(framework, mode, chips, param_sharding, remat, dp)


def _candidate(request, model_cfg, point, group, local, memory, capacity, step, comm
               ) -> Candidate:
    fits = memory.value is not None and memory.value <= capacity
    tokens = point.dp * request.batch_size * request.seq_len  # every replica's sequences
    per_chip = total = mfu = Figure(value=None, basis=step.basis, note=step.note)
    if step.value:
        ids = step.trial_ids
        per_chip = Figure(value=tokens / step.value / point.chips, basis=step.basis,
                          trial_ids=ids)
        total = Figure(value=tokens / step.value, basis=step.basis, trial_ids=ids)
        peak = _peak(request, group)
        model_flops = model_flops_per_step(model_cfg, batch=point.dp * request.batch_size,
                                           seq_len=request.seq_len).total
        value = model_flops / (step.value * point.chips * peak) if peak else None
        if value is not None and value > 1:
            mfu = Figure(value=None, basis="refused", trial_ids=ids,
                         note=f"the fits predict MFU {value:.2f} > 1, which no chip reaches: "
                              "the prediction is wrong here (too far from the trials)")
            per_chip = total = Figure(value=None, basis="refused", note=mfu.note)
        else:
            mfu = Figure(value=value, basis=step.basis, trial_ids=ids,
                         note="" if peak else "no peak FLOP/s known for this chip")
    return Candidate(framework=point.framework, kernels=request.kernels,
                     gdn_kernel=gdn_kernel_label(point.framework, request.kernels),
                     mode="none" if point.cp_chips == 1 else point.mode,
                     chips=point.chips, dp=point.dp, cp_chips=point.cp_chips,
                     global_batch_size=point.dp * request.batch_size,
                     param_sharding=point.param_sharding, remat=point.remat,
                     local_tokens=local, fits=fits, memory_bytes_per_chip=memory,
                     chip_memory_bytes=capacity, step_time_s=step,
                     tokens_per_s_per_chip=per_chip, tokens_per_s=total, mfu=mfu,
                     comm_bytes_per_step_per_chip=comm)
