"""Plan trials: `kind` ('measure' or 'plan') on trials and results, the compiled program's
matmul FLOPs per chip, and the planning views by kind.

- `trials.kind`, `results.kind`: 'measure' for every existing row. A plan trial compiles the
  JAX step for its chips without running it (gdn_core.jax_gdn.plan): its result holds XLA's
  memory estimate (estimated_memory_bytes_per_chip), the HLO's collective bytes and
  `compiled_flops_per_step_per_chip`, never a measured peak, step time or MFU.
- `results.compiled_flops_per_step_per_chip`: matmul FLOPs of the compiled per-chip program,
  loop trips counted (gdn_core.jax_gdn.hlo_flops), NULL where no program was read.
- Views: `best_tokens_per_s_per_chip` keeps measured rows only and says so in a `kind` column;
  `max_seq_len_fit` is grouped by kind too (for plans: the longest sequence compiled, and the
  largest estimate).

Revision ID: 0006_plan_trials
Revises: 0005_cache_versions
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views, views_of

revision = "0006_plan_trials"
down_revision = "0005_cache_versions"
branch_labels = None
depends_on = None

GRID = "preset, num_layers, accelerator_type, dtype, param_sharding, remat"

# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT kind, {GRID}, seq_len, framework, mode, chips, batch_size,
       tokens_per_s_per_chip, mfu, step_time_s, step_time_min_s, step_time_max_s,
       measured_steps, peak_flops_dtype, device_name,
       peak_memory_bytes_per_chip, memory_source, estimated_memory_bytes_per_chip,
       predicted_memory_bytes_per_chip, trial_id, sweep_id, finished_at
FROM (
    SELECT r.*,
           ROW_NUMBER() OVER (
               PARTITION BY {GRID}, seq_len
               ORDER BY tokens_per_s_per_chip DESC, trial_id) AS rn
    FROM results r
    WHERE status = 'succeeded' AND kind = 'measure' AND tokens_per_s_per_chip IS NOT NULL
) ranked
WHERE rn = 1
"""

MAX_SEQ_LEN_VIEW = f"""
CREATE VIEW max_seq_len_fit AS
SELECT kind, {GRID}, batch_size, framework, mode, chips,
       MAX(CASE WHEN status = 'succeeded' THEN seq_len END) AS max_seq_len_succeeded,
       MIN(CASE WHEN status = 'oom' THEN seq_len END) AS min_seq_len_oom,
       MAX(CASE WHEN status = 'succeeded' THEN peak_memory_bytes_per_chip END)
           AS max_peak_memory_bytes_per_chip,
       MAX(CASE WHEN status = 'succeeded' THEN memory_source END) AS memory_source,
       MAX(CASE WHEN status = 'succeeded' THEN estimated_memory_bytes_per_chip END)
           AS max_estimated_memory_bytes_per_chip,
       MAX(CASE WHEN status = 'succeeded' THEN predicted_memory_bytes_per_chip END)
           AS max_predicted_memory_bytes_per_chip,
       COUNT(*) AS trials
FROM results
WHERE status IN ('succeeded', 'oom')
GROUP BY kind, {GRID}, batch_size, framework, mode, chips
"""


def upgrade() -> None:
    drop_views()
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    for table in ("trials", "results"):
        op.add_column(table, sa.Column("kind", sa.String(8), nullable=False,
                                       server_default=sa.text("'measure'")))
    op.add_column("results", sa.Column("compiled_flops_per_step_per_chip", sa.Float))
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    plans = op.get_bind().execute(sa.text("SELECT COUNT(*) FROM trials WHERE kind = 'plan'"))
    if plans.scalar():
        raise RuntimeError("the database holds plan trials, which 0005 cannot express: delete "
                           "their sweeps before downgrading")
    drop_views()
    op.execute("ALTER TABLE results DROP COLUMN compiled_flops_per_step_per_chip")
    for table in ("results", "trials"):
        op.execute(f"ALTER TABLE {table} DROP COLUMN kind")
    create_views(*views_of("0003_true_metrics.py"))
