"""What the planner's form starts from: the settings of the trials the database holds, so the
first question asked is one they can answer (GET /api/capacity/defaults).

The most common (preset, chip type, dtype, kernels, decoder, depth) among succeeded measured
single-document trials — ties to the latest —, every framework those trials ran, their longest
sequence and largest mesh: a plan there rests on measured step times. A database without
measured trials gives no defaults (the form then asks for a preset, a length and a chip).
"""

from __future__ import annotations

from collections import Counter

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gdn_core.config import LAYERS
from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import ATTN_CP_MODES
from gdn_core.presets import PRESETS
from service.db.models import Result
from service.planner.evidence import PLANNED_DOCUMENTS, canonical_chip
from service.schemas.planner import FormDefaults, PlannerForm

_KEY = (Result.preset, Result.accelerator_type, Result.dtype, Result.kernels, Result.layers,
        Result.num_layers)


def form_defaults(session: Session) -> PlannerForm:
    """The form's choices and the defaults the stored trials suggest (module docstring)."""
    choices = dict(layers=list(LAYERS), attn_cps=list(ATTN_CP_MODES), layouts=list(LAYOUTS))
    measured = (Result.status == "succeeded", Result.kind == "measure",
                Result.documents == PLANNED_DOCUMENTS)
    rows = session.execute(select(*_KEY, func.count(), func.max(Result.trial_id))
                           .where(*measured).group_by(*_KEY)).all()
    rows = [r for r in rows if r.preset in PRESETS]
    if not rows:
        return PlannerForm(**choices, defaults=FormDefaults(), trials=0,
                           source="no succeeded measured trial stored: no defaults")
    preset, chip, dtype, kernels, layers, num_layers, count, _ = max(
        rows, key=lambda r: (r[6], r[7]))
    same = (Result.preset == preset, Result.accelerator_type == chip, Result.dtype == dtype,
            Result.kernels == kernels, Result.layers == layers,
            Result.num_layers == num_layers)
    trials = session.execute(select(Result.framework, Result.seq_len, Result.chips)
                             .where(*measured, *same)).all()
    frameworks = Counter(t.framework for t in trials)
    defaults = FormDefaults(
        preset=preset, accelerator=canonical_chip(chip), dtype=dtype, kernels=kernels,
        layers=[layers], frameworks=sorted(frameworks),
        num_layers=None if num_layers == PRESETS[preset].num_layers else num_layers,
        seq_len=max(t.seq_len for t in trials), max_chips=max(t.chips for t in trials))
    return PlannerForm(
        **choices, defaults=defaults, trials=count,
        source=f"the most common settings of the stored measured trials: {count} trial(s) of "
               f"{preset} ({layers}) on {chip}, {dtype}, {kernels} kernels, "
               f"{', '.join(sorted(frameworks))}")


__all__ = ["FormDefaults", "PlannerForm", "form_defaults"]
