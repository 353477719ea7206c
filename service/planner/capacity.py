"""The capacity planner: every (mesh, mode, settings) that fits a target, and how fast.

A mesh is dp data-parallel replicas × a CP group of chips / dp chips each (meshes.py: a
dp > 1 mesh is predicted from its replica, the dp = 1 candidate on chips / dp chips, which
everything below fits to dp = 1 trials).

A candidate is also a decoder (gdn_only or the hybrid) and, for the hybrid, its attention CP
mode and sequence layout (points.py); its memory and FLOPs are gdn_core's for that decoder,
and only trials of the same decoder (and, mode by mode, the same attn_cp and layout) are its
evidence.

For each candidate the memory per chip is gdn_core's predictor refined by the memory fit, the
step time the compute fit plus the mode's link fit over its bytes and rounds, and each figure
says what it rests on: `measured` (a trial of exactly this point), `interpolated` (inside the
fitted range), `extrapolated` (beyond it, up to EXTRAPOLATION_LIMIT) — past that the fits
refuse. Where they refuse on a chip type with a datasheet, the step time is the roofline at a
stated efficiency (`roofline`: roofline.py, published_runs.py); else it is refused (None)
with the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gdn_core import datasheets
from gdn_core.train_config import (
    TrainConfig,
)
from service.planner.evidence import Observation, interpreted_caveat, say_left_out, split_speed
from service.planner.fits import (
    AffineFit,
    LinkFit,
    TimeCurve,
    chips_curve,
    dependent_rounds,
    fit_compute,
    fit_links,
    fit_memory,
    scaled_comm_bytes,
)
from service.planner.cached import hardware_flops, step_memory
from service.planner.candidates import (
    chip_memory,
    drop_dominated_variants,
    make_candidate,
    pareto_frontier,
    plan_checks,
)
from service.planner.meshes import mesh_comm_and_step, mesh_memory
from service.planner.points import (
    Point,
    candidate_points,
    has_attention,
    matches,
    model_for,
    same_split,
)
from service.planner.published_runs import Efficiency, efficiency_for
from service.planner.roofline import estimate_step, roofline_comm, scaled_by_count
from service.schemas.planner import (
    Basis,
    Candidate,
    CapacityAnswer,
    CapacityRequest,
    Figure,
)

EXTRAPOLATION_LIMIT = 16
"""A fit is used at most this many times past the largest local shard (memory), per-chip
FLOPs (compute) or chip count (links) it was fitted on; beyond, the figure is refused."""

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
    predicted = step_memory(model_cfg, train_cfg, mode=point.mode, chips=point.cp_chips,
                                    dp=point.dp, framework=point.framework,
                                    attn_cp=point.attn_cp or "all_gather_kv",
                                    layout=point.layout, kernels=request.kernels).total
    if model_cfg.moe is not None:
        exact = []  # its trials ran the dense stand-in: their memory is not the experts'
    peaks = [o for o in exact if o.memory_is_peak]
    if peaks:
        return Figure(value=max(o.memory_bytes for o in peaks), basis="measured",
                      trial_ids=[o.trial_id for o in peaks], note=peaks[0].memory_source or "")
    estimates = [o for o in exact if o.memory_bytes is not None]
    if estimates:
        return Figure(value=estimates[0].memory_bytes, basis="estimated",
                      trial_ids=[estimates[0].trial_id], note=estimates[0].memory_source or "")
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


def _comm(group, point: Point, local_tokens: int, request: CapacityRequest,
          model_cfg) -> tuple[Figure, float | None]:
    """Bytes per chip: recorded at this point, else scaled from the nearest chip count — by
    the GDN mode's growth in D (fits.scaled_comm_bytes), or for a decoder with attention
    layers by the analytic count's ratio (roofline.comm_bytes: attention grows otherwise)."""
    rows = [o for o in group if o.cp_mode == point.mode or o.chips == 1]
    scaled = (scaled_by_count(rows, point, request, model_cfg) if has_attention(model_cfg)
              else scaled_comm_bytes(rows, mode=point.mode, chips=point.chips,
                                     local_tokens=local_tokens))
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
    lengths (fits.chips_curve: their compute and contention, the link model's time of their
    bytes taken out and the target's added back); else the one-chip compute curve plus the
    link model over the mode's bytes and rounds."""
    timed = [o for o in exact if o.kind == "measure" and o.step_time_s]
    if timed:
        return Figure(value=statistics.median(o.step_time_s for o in timed), basis="measured",
                      trial_ids=[o.trial_id for o in timed])
    per_chip = hardware_flops(
        model_cfg, mode=point.mode, chips=point.chips, batch=request.batch_size,
        seq_len=request.seq_len, framework=point.framework, remat=point.remat,
        attn_cp=point.attn_cp or "all_gather_kv", layout=point.layout,
        kernels=request.kernels) / point.chips
    same = chips_curve(on_chip, links, mode=point.mode, chips=point.chips)
    if same is not None:
        basis, why = _basis(per_chip, same.flops_max, same.flops_min)
        seconds = same.seconds_at(per_chip, comm_bytes, _rounds(point, model_cfg))
        if basis != "refused" and seconds is not None:
            return Figure(value=seconds, basis=basis, trial_ids=list(same.trial_ids),
                          note=f"{point.mode}: {same.note}" + (f"; {why}" if why else ""))
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
                  note=f"compute at {compute.flops_per_s_at(per_chip):.3g} FLOP/s per chip "
                       f"(one-chip trials, exponent {compute.exponent:.2f} beyond them); links: "
                       f"{links.source}" + (f"; {why}" if why else ""))


def _rounds(point: Point, model_cfg) -> int:
    return dependent_rounds(point.mode, point.cp_chips, num_layers=model_cfg.num_layers,
                            remat=point.remat, dp=point.dp)


def _peak(request: CapacityRequest, group) -> float | None:
    if request.accelerator != "cpu":
        return datasheets.peak_flops_per_chip(request.accelerator, request.dtype)
    peaks = [o.peak_flops_per_chip for o in group if o.peak_flops_per_chip]
    return statistics.median(peaks) if peaks else None


def plan_capacity(observations: Sequence[Observation], request: CapacityRequest
                  ) -> CapacityAnswer:
    """Every candidate (framework, decoder, mesh of chips ≤ max_chips, mode, attn_cp, layout,
    param_sharding, remat) of the request, predicted from `observations` (load_observations),
    and the three picks."""
    base = request.model()
    observations, interpreted = split_speed(observations)
    interpreted = [o for o in interpreted if o.kernels == request.kernels
                   and o.framework in request.frameworks]
    efficiency = efficiency_for(request.accelerator, request.dtype)
    candidates: list[Candidate] = []
    fitted: dict[tuple, tuple] = {}  # per step settings and split: the trials, compute curve
    linked: dict[tuple, LinkFit] = {}  # per step settings, split and mode
    models = {layers: model_for(base, layers) for layers in request.planned_layers()}
    for point in candidate_points(request, observations, base):
        model_cfg = models[point.layers]
        replica = point.replica()  # a dp > 1 mesh: its figures from its replica's
        settings = (point.framework, point.param_sharding, point.remat, point.layers,
                    point.attn_cp, point.layout)
        if settings not in fitted:
            alike = [o for o in observations if same_split(o, point)]
            meshes = [o for o in alike if o.accelerator_type == request.accelerator
                      and matches(o, request, replica, model_cfg.num_layers, any_dp=True)]
            group = [o for o in alike if matches(o, request, replica, model_cfg.num_layers)]
            on_chip = [o for o in group if o.accelerator_type == request.accelerator]
            fitted[settings] = (group, on_chip, fit_compute(on_chip), meshes, alike,
                                _peak(request, group))
        group, on_chip, compute, meshes, alike, peak = fitted[settings]
        if (settings, point.mode) not in linked:  # links: measured trials of every dp × cp
            linked[settings, point.mode] = fit_links(
                meshes, compute, accelerator_type=request.accelerator, mode=point.mode)
        links = linked[settings, point.mode]
        exact = [o for o in group if o.chips == replica.chips and o.seq_len == request.seq_len
                 and (o.cp_mode == point.mode)]
        local = request.batch_size * request.seq_len // point.cp_chips
        memory = predict_memory(request, model_cfg, replica, group, exact)
        comm, comm_bytes = _comm(group, replica, local, request, model_cfg)
        step = _step(request, model_cfg, replica, on_chip, exact, compute, links, comm_bytes)
        if point.dp > 1:
            memory, comm, step = _mesh_figures(request, model_cfg, point, alike, group,
                                               local, memory, comm, step, links)
        if efficiency is not None:
            step, comm = _roofline_where_refused(request, model_cfg, point, efficiency, step,
                                                 comm)
        left_out = [o for o in interpreted
                    if matches(o, request, replica, model_cfg.num_layers, any_dp=True)]
        if left_out:
            memory, step = say_left_out(left_out, memory, step)
        candidates.append(make_candidate(
            request, model_cfg, point, peak=peak, local=local, memory=memory,
            capacity=chip_memory(request, point.chips)[0], step=step, comm=comm))
    left = 0
    if request.prunes_variants:
        candidates, left = drop_dominated_variants(candidates)
    return _answer(request, base, candidates, observations, interpreted, efficiency, left)


def _roofline_where_refused(request, model_cfg, point: Point, efficiency: Efficiency,
                            step: Figure, comm: Figure) -> tuple[Figure, Figure]:
    """(step, comm): the roofline estimate for the whole mesh where the fits refused its step
    (the fits' reason kept in the note), the analytic bytes where no trial recorded any."""
    if step.basis == "refused":
        roof = estimate_step(request, model_cfg, point, efficiency, why=step.note)
        if roof is not None:
            step = roof
    if comm.basis == "refused":
        comm = roofline_comm(request, model_cfg, point)
    return step, comm


def _answer(request: CapacityRequest, model_cfg, candidates: list[Candidate], observations,
            interpreted, efficiency: Efficiency | None, variants_left_out: int
            ) -> CapacityAnswer:
    fitting = [c for c in candidates if c.fits]
    timed = [c for c in fitting if c.tokens_per_s.value is not None]
    one_chip_memory, one_chip_source = chip_memory(request, 1)
    caveats = [
        "A plan trial's memory is XLA:CPU's compile-time estimate: the program a TPU or GPU "
        "would run, with buffer sizes that differ by backend — compare it with a measured "
        "trial of the same point before trusting it to a few percent.",
        "Step times on a chip type come from measured trials on that type where they answer; "
        "links without trials at several chip counts use the datasheet prior."
        + ("" if efficiency is None else " Where no trial answers, the step time is the "
           f"roofline at {efficiency.label} (basis roofline): {efficiency.source}."),
    ]
    if variants_left_out:
        caveats.append(f"{variants_left_out} attn_cp / layout variant(s) left out: another of "
                       "the same mesh and settings fits as well with no more memory and no "
                       "longer step (list attn_cps or layouts to see every one).")
    if "jax" in request.frameworks and request.kernels == "fused":
        caveats.append("JAX's fused GDN layers run this project's Pallas chunk rule, composed "
                       "with every CP mode (what MaxText turns off under context "
                       "parallelism); until a measured (non-interpreted) trial of it exists, "
                       "its candidates' step times are marked unmeasured.")
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
        evidence_trials=len(observations), variants_left_out=variants_left_out,
        speed_basis=efficiency,
        caveats=caveats)


def _mesh_figures(request, model_cfg, point: Point, observations, group, local: int,
                  memory: Figure, comm: Figure, step: Figure, links: LinkFit):
    """(memory, comm, step) of a dp > 1 mesh: a trial of exactly it where there is one (a
    measured trial: all three; a plan: its XLA estimate of memory, labelled `estimated` as
    any plan's, and its compiled bytes), else its replica's figures moved by what dp changes
    (meshes.py)."""
    exact = [o for o in observations if matches(o, request, point, model_cfg.num_layers)
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


