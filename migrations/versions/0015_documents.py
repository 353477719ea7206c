"""The `documents` dimension (issue 24 item 2): how each sequence of a trial's step is packed.

- `documents` (String(40), 'single' | 'uniform:LO-HI': gdn_core.packing) on trials and
  results: every existing row trained one document per sequence, so it gets 'single' (the
  server default).
- Trial keys are unchanged: a key names `/documents=…` only when it is not 'single'
  (workers.grid.trial_key), so stored keys keep meaning what they meant and resume finds them;
  stored sweep specs lack `documents` and default to ['single'], which expands to exactly the
  trials they were created with.
- Views: `documents` joins the step settings both views group by. A packed step is other work
  than an unpacked one (attention never crosses a document boundary), so its tokens/s/chip
  competes only with trials packed alike in `best_tokens_per_s_per_chip`, and
  `max_seq_len_fit` keeps its lengths apart.

Revision ID: 0015_documents
Revises: 0014_profiles
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views

revision = "0015_documents"
down_revision = "0014_profiles"
branch_labels = None
depends_on = None

GRID_0010 = "preset, num_layers, layers, accelerator_type, dtype, param_sharding, remat"
GRID = f"{GRID_0010}, documents"

_BEST_COLUMNS = """tokens_per_s_per_chip, mfu, step_time_s, step_time_min_s, step_time_max_s,
       measured_steps, peak_flops_dtype, device_name, gdn_kernel, attention_kernel,
       peak_memory_bytes_per_chip, memory_source, estimated_memory_bytes_per_chip,
       predicted_memory_bytes_per_chip, trial_id, sweep_id, finished_at"""


def best_tokens_view(grid: str) -> str:
    """`best_tokens_per_s_per_chip` over the step settings `grid`. Its ranked rows name their
    columns where 0010 wrote `r.*`: PostgreSQL expands `*` when the view is created, so a view
    made now would pin every later column of results (0012's, 0014's) and their downgrades
    could not drop them."""
    point = f"kind, {grid}, seq_len, framework, kernels, mode, attn_cp, layout, chips, dp"
    return f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT {point},
       batch_size, dp * batch_size AS global_batch_size,
       {_BEST_COLUMNS}
FROM (
    SELECT {point}, batch_size,
           {_BEST_COLUMNS},
           ROW_NUMBER() OVER (
               PARTITION BY {grid}, seq_len
               ORDER BY tokens_per_s_per_chip DESC, trial_id) AS rn
    FROM results r
    WHERE status = 'succeeded' AND kind = 'measure' AND tokens_per_s_per_chip IS NOT NULL
) ranked
WHERE rn = 1
"""


def max_seq_len_view(grid: str) -> str:
    """`max_seq_len_fit` grouped by the step settings `grid`."""
    return f"""
CREATE VIEW max_seq_len_fit AS
SELECT kind, {grid}, batch_size, framework, kernels, mode, attn_cp, layout, chips, dp,
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
GROUP BY kind, {grid}, batch_size, framework, kernels, mode, attn_cp, layout, chips, dp
"""


# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = best_tokens_view(GRID)
MAX_SEQ_LEN_VIEW = max_seq_len_view(GRID)

_TABLES = ("trials", "results")


def upgrade() -> None:
    drop_views()
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    for table in _TABLES:
        op.add_column(table, sa.Column("documents", sa.String(40), nullable=False,
                                       server_default=sa.text("'single'")))
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    packed = op.get_bind().execute(sa.text(
        "SELECT (SELECT COUNT(*) FROM trials WHERE documents <> 'single') "
        "+ (SELECT COUNT(*) FROM results WHERE documents <> 'single')"))
    if packed.scalar():
        raise RuntimeError("the database holds trials on packed documents (documents other "
                           "than 'single'), which 0014 cannot express: delete their sweeps "
                           "before downgrading")
    drop_views()
    for table in reversed(_TABLES):
        op.execute(f"ALTER TABLE {table} DROP COLUMN documents")
    # 0010's views, as it defined them (the same columns), written as above
    create_views(best_tokens_view(GRID_0010), max_seq_len_view(GRID_0010))
