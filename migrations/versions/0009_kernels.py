"""The `kernels` dimension (issue 23): which implementation a trial ran, and what it resolved to.

- `kernels` ('reference' | 'fused') on trials and results: every existing row ran this
  project's own torch / JAX code, so it gets 'reference' (the server default).
- `gdn_kernel`, `attention_kernel` on results: the implementations a succeeded trial's workers
  resolved (gdn_core.kernels.resolve_kernels), named with versions, e.g. "reference jax chunk
  rule" or "jax 0.10.2 dot_product_attention xla"; attention_kernel NULL without attention
  layers. NULL on existing rows: nothing recorded what they resolved to (they ran the
  reference, which `kernels` now says).
- Trial keys are unchanged: a key names `kernels` only when it is not 'reference'
  (workers.grid.trial_key), so stored keys keep meaning what they meant and resume finds them;
  stored sweep specs lack `kernels` and default to ['reference'], which expands to exactly the
  trials they were created with.
- Views: `best_tokens_per_s_per_chip` says which kernels won (and what they resolved to), as
  it says which mode won; `max_seq_len_fit` is grouped by `kernels` as well (a fused kernel
  holds other buffers than the reference).

Revision ID: 0009_kernels
Revises: 0008_hybrid_dimensions
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views, views_of

revision = "0009_kernels"
down_revision = "0008_hybrid_dimensions"
branch_labels = None
depends_on = None

GRID = "preset, num_layers, layers, accelerator_type, dtype, param_sharding, remat"

# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT kind, {GRID}, seq_len, framework, kernels, mode, attn_cp, layout, chips, batch_size,
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
SELECT kind, {GRID}, batch_size, framework, kernels, mode, attn_cp, layout, chips,
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
GROUP BY kind, {GRID}, batch_size, framework, kernels, mode, attn_cp, layout, chips
"""

_TABLES = ("trials", "results")
_RESOLVED = ("gdn_kernel", "attention_kernel")


def upgrade() -> None:
    drop_views()
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    for table in _TABLES:
        op.add_column(table, sa.Column("kernels", sa.String(16), nullable=False,
                                       server_default=sa.text("'reference'")))
    for column in _RESOLVED:
        op.add_column("results", sa.Column(column, sa.Text()))
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    new = op.get_bind().execute(sa.text(
        "SELECT COUNT(*) FROM trials WHERE kernels <> 'reference'"))
    if new.scalar():
        raise RuntimeError("the database holds fused-kernel trials, which 0008 cannot "
                           "express: delete their sweeps before downgrading")
    drop_views()
    for column in reversed(_RESOLVED):
        op.execute(f"ALTER TABLE results DROP COLUMN {column}")
    for table in reversed(_TABLES):
        op.execute(f"ALTER TABLE {table} DROP COLUMN kernels")
    create_views(*views_of("0008_hybrid_dimensions.py"))
