"""`gdn-sweep plan --validate`'s roofline section: how far the roofline estimate (roofline.py)
was from each measured trial of the sweep.

For every measured trial: its roof (the fastest the step could be: hardware FLOPs at the
peak, HBM bytes at the bandwidth, the links at their prior), the estimate at the efficiency
the planner would assume on that chip type (published_runs.py; on virtual CPU chips, which
have none, the default), the measured step time, the estimate's error and the share of the
roof the trial reached. On virtual CPU chips the peak is the trial's own GEMM calibration
(recorded with it) and the HBM term is left out (no datasheet bandwidth).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from service.planner.evidence import Observation
from service.planner.points import Point, model_for
from service.planner.published_runs import DEFAULT_MFU, DEFAULT_RANGE, Efficiency, efficiency_for
from service.planner.roofline import estimate_step, roofline
from service.schemas.planner import CapacityRequest

CPU_EFFICIENCY = Efficiency(
    mfu=DEFAULT_MFU, low=DEFAULT_RANGE[0], high=DEFAULT_RANGE[1], published=False,
    label=f"the default {100 * DEFAULT_MFU:.1f}% MFU (no published run on virtual CPU chips)",
    source="published_runs.DEFAULT_SOURCE, against the trial's calibrated GEMM peak")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RooflineCheck:
    trial_id: int
    point: str
    measured_s: float
    roof_s: float
    estimate_s: float
    efficiency: str
    """The efficiency the estimate assumed (its label)."""

    @property
    def error(self) -> float:
        """|estimate − measured| ÷ measured."""
        return abs(self.estimate_s - self.measured_s) / self.measured_s

    @property
    def share_of_roof(self) -> float:
        """roof ÷ measured: the fraction of the roofline the trial reached (≤ 1 unless the
        roof's counts miss work)."""
        return self.roof_s / self.measured_s


def roofline_checks(observations: Sequence[Observation]) -> list[RooflineCheck]:
    """A RooflineCheck per measured trial with a step time (and, on CPU chips, a calibrated
    peak); trials of a shape the counts cannot split are left out."""
    checks = []
    for o in observations:
        if o.kind != "measure" or not o.step_time_s:
            continue
        cpu = o.accelerator_type == "cpu"
        if cpu and not o.peak_flops_per_chip:
            continue
        try:
            request = CapacityRequest(
                preset=o.preset, seq_len=o.seq_len, accelerator=o.accelerator_type,
                max_chips=o.chips, batch_size=o.batch_size, dtype=o.dtype,
                frameworks=[o.framework], num_layers=o.num_layers, kernels=o.kernels)
        except ValueError:
            continue
        model_cfg = model_for(request.model(), o.layers)
        point = Point(o.framework, o.cp_mode, o.chips, o.param_sharding, o.remat, o.dp,
                      o.layers, o.attn_cp if o.cp_chips > 1 else None, o.layout)
        efficiency = CPU_EFFICIENCY if cpu else efficiency_for(o.accelerator_type, o.dtype)
        peak = o.peak_flops_per_chip if cpu else None
        try:
            roof = roofline(request, model_cfg, point, peak=peak)
            estimate = estimate_step(request, model_cfg, point, efficiency, peak=peak)
        except ValueError:
            continue
        mesh = f"chips={o.chips}" + (f"/dp={o.dp}" if o.dp > 1 else "")
        checks.append(RooflineCheck(
            trial_id=o.trial_id, point=f"{o.framework}/{o.mode}/{mesh}/seq_len={o.seq_len}",
            measured_s=o.step_time_s, roof_s=roof.seconds, estimate_s=estimate.value,
            efficiency=efficiency.label))
    return checks


__all__ = ["CPU_EFFICIENCY", "RooflineCheck", "roofline_checks"]
