"""The `dp` dimension (issue 24): data-parallel replicas of a trial's mesh.

- `dp` (Integer) on trials and results: a trial's `chips` are all chips of its mesh, dp
  replicas of chips / dp CP chips each, and `batch_size` counts the sequences of one replica
  (the step's global batch is dp × batch_size). Every existing row ran one replica, so it
  gets 1 (the server default).
- Trial keys are unchanged: a key names `/dp=n` only when n > 1 (workers.grid.trial_key), so
  stored keys keep meaning what they meant and resume finds them; stored sweep specs lack
  `dp` and default to [1], which expands to exactly the trials they were created with.
- Views: `best_tokens_per_s_per_chip` says which dp won (beside the chips and the mode), and
  the global batch it trained; `max_seq_len_fit` is grouped by `dp` as well (a replica holds
  its own activations: dp × cp chips fit other lengths than cp chips alone).

Revision ID: 0010_data_parallel
Revises: 0009_kernels
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views, views_of

revision = "0010_data_parallel"
down_revision = "0009_kernels"
branch_labels = None
depends_on = None

GRID = "preset, num_layers, layers, accelerator_type, dtype, param_sharding, remat"

# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT kind, {GRID}, seq_len, framework, kernels, mode, attn_cp, layout, chips, dp,
       batch_size, dp * batch_size AS global_batch_size,
       tokens_per_s_per_chip, mfu, step_time_s, step_time_min_s, step_time_max_s,
       measured_steps, peak_flops_dtype, device_name, gdn_kernel, attention_kernel,
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
SELECT kind, {GRID}, batch_size, framework, kernels, mode, attn_cp, layout, chips, dp,
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
GROUP BY kind, {GRID}, batch_size, framework, kernels, mode, attn_cp, layout, chips, dp
"""

_TABLES = ("trials", "results")


def upgrade() -> None:
    drop_views()
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    for table in _TABLES:
        op.add_column(table, sa.Column("dp", sa.Integer(), nullable=False,
                                       server_default=sa.text("1")))
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    replicated = op.get_bind().execute(sa.text(
        "SELECT (SELECT COUNT(*) FROM trials WHERE dp > 1) "
        "+ (SELECT COUNT(*) FROM results WHERE dp > 1)"))
    if replicated.scalar():
        raise RuntimeError("the database holds data-parallel trials (dp > 1), which 0009 "
                           "cannot express: delete their sweeps before downgrading")
    drop_views()
    for table in reversed(_TABLES):
        op.execute(f"ALTER TABLE {table} DROP COLUMN dp")
    create_views(*views_of("0009_kernels.py"))
