"""Results whose fused kernels ran through their own interpreters: a correctness check, never
a speed.

Under GDN_SWEEP_INTERPRET_KERNELS=1 a fused trial on a CPU runs fla-core's rule under Triton's
interpreter and splash attention under Pallas's (gdn_core.interpreted_kernels); its result
stores the kernel's name with " (interpreted)" in `gdn_kernel` and/or `attention_kernel`. Its
step time is the interpreter's (Python stepping through a GPU program), so whatever reads a
speed leaves it out: the planner (memory too: the interpreter's buffers are not the kernel's),
regressions, the dashboard's plots and the SQL views (migration 0016, the same test in SQL);
listings show the row with its speeds marked (TrialPublic.interpreted).
"""

from __future__ import annotations

from sqlalchemy import and_, func, not_
from sqlalchemy.sql.elements import ColumnElement

from gdn_core.interpreted_kernels import INTERPRETED_SUFFIX, is_interpreted
from service.db.models import Result

INTERPRETED_NOTE = "interpreted kernels: a correctness run, not a speed"
"""What an answer says where it leaves such a result out."""

SPEED_FIELDS: tuple[str, ...] = (
    "tokens_per_s_per_chip", "scaling_efficiency", "speedup_vs_one_chip", "step_time_s",
    "step_time_min_s", "step_time_max_s", "mfu", "hfu")
"""TrialPublic's figures that are speeds (or ratios of them): an interpreted row's are shown
as `interpreted`, never as a number."""


def ran_interpreted(gdn_kernel: str | None, attention_kernel: str | None) -> bool:
    """Whether a result with these stored kernel names ran a kernel interpreted."""
    return is_interpreted(gdn_kernel) or is_interpreted(attention_kernel)


def compiled_kernels(result=Result) -> ColumnElement[bool]:
    """SQL: rows of `result` (the table or an alias of it) that ran no kernel interpreted —
    empty names (reference rows, rows stored before kernels were recorded) included."""
    return and_(*(not_(func.coalesce(name, "").endswith(INTERPRETED_SUFFIX, autoescape=True))
                  for name in (result.gdn_kernel, result.attention_kernel)))
