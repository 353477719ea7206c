"""The hybrid decoder's grid dimensions on trials and results: `layers`, `attn_cp`, `layout`;
the planning views by them.

- `layers` ('gdn_only' | 'hybrid'): which decoder the trial trained. Every existing row ran
  the GDN-only stack, so it gets 'gdn_only'.
- `attn_cp` ('all_gather_kv' | 'ring' | 'ulysses'): the CP mode of a hybrid's full-attention
  layers; NULL where no attention was split: GDN-only trials (every existing row) and one-chip
  baselines.
- `layout` ('contiguous' | 'zigzag'): which tokens each chip held; existing rows ran
  contiguous shards.
- Trial keys are unchanged: a key names these dimensions only when they differ from the values
  above (workers.grid.trial_key), so stored keys keep meaning what they meant and resume finds
  them. Stored sweep specs need no rewrite: their missing `layers`, `attn_cps`, `layouts`
  default to gdn_only / all_gather_kv (unused without attention) / contiguous, which expand to
  exactly the trials they were created with.
- Views: `best_tokens_per_s_per_chip` picks the best row per model decoder (partitioned by
  `layers` as well: a hybrid and a GDN-only stack are different models) and says which
  attn_cp and layout won, as it says which mode and chip count; `max_seq_len_fit` is grouped
  by all three.

Revision ID: 0008_hybrid_dimensions
Revises: 0007_schedules
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views, views_of

revision = "0008_hybrid_dimensions"
down_revision = "0007_schedules"
branch_labels = None
depends_on = None

GRID = "preset, num_layers, layers, accelerator_type, dtype, param_sharding, remat"

# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT kind, {GRID}, seq_len, framework, mode, attn_cp, layout, chips, batch_size,
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
SELECT kind, {GRID}, batch_size, framework, mode, attn_cp, layout, chips,
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
GROUP BY kind, {GRID}, batch_size, framework, mode, attn_cp, layout, chips
"""

_TABLES = ("trials", "results")


def upgrade() -> None:
    drop_views()
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    for table in _TABLES:
        op.add_column(table, sa.Column("layers", sa.String(16), nullable=False,
                                       server_default=sa.text("'gdn_only'")))
        op.add_column(table, sa.Column("attn_cp", sa.String(16)))
        op.add_column(table, sa.Column("layout", sa.String(16), nullable=False,
                                       server_default=sa.text("'contiguous'")))
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    new = op.get_bind().execute(sa.text(
        "SELECT COUNT(*) FROM trials WHERE layers <> 'gdn_only' OR layout <> 'contiguous' "
        "OR attn_cp IS NOT NULL"))
    if new.scalar():
        raise RuntimeError("the database holds hybrid or zigzag trials, which 0007 cannot "
                           "express: delete their sweeps before downgrading")
    drop_views()
    for table in reversed(_TABLES):
        for column in ("layout", "attn_cp", "layers"):
            op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    create_views(*views_of("0006_plan_trials.py"))
