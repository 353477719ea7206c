"""Step settings as grid dimensions: param_sharding and remat on trials and results, the CP
and weight-sync bytes as columns of their own, trial keys naming every grid dimension.

Existing rows ran replicated without recomputation, so they get those values, and their keys
gain the dimensions they lacked (so a resumed old sweep still finds its trials).

Revision ID: 0002_step_settings
Revises: 0001_initial
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views

revision = "0002_step_settings"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

SETTINGS = (("param_sharding", 16, "replicated"), ("remat", 8, "none"))
KEY_SUFFIX = "'/dtype=' || dtype || '/param_sharding=' || param_sharding || '/remat=' || remat"
GRID_COLUMNS = "preset, num_layers, accelerator_type, dtype, param_sharding, remat"
GRID_COLUMNS_0001 = "preset, num_layers, accelerator_type, dtype"


# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
def best_tokens_view(grid: str) -> str:
    return f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT {grid}, seq_len, framework, mode, chips, batch_size,
       tokens_per_s_per_chip, mfu, peak_memory_bytes_per_chip, step_time_s,
       trial_id, sweep_id, finished_at
FROM (
    SELECT r.*,
           ROW_NUMBER() OVER (
               PARTITION BY {grid}, seq_len
               ORDER BY tokens_per_s_per_chip DESC, trial_id) AS rn
    FROM results r
    WHERE status = 'succeeded' AND tokens_per_s_per_chip IS NOT NULL
) ranked
WHERE rn = 1
"""


def max_seq_len_view(grid: str) -> str:
    return f"""
CREATE VIEW max_seq_len_fit AS
SELECT {grid}, batch_size, framework, mode, chips,
       MAX(CASE WHEN status = 'succeeded' THEN seq_len END) AS max_seq_len_succeeded,
       MIN(CASE WHEN status = 'oom' THEN seq_len END) AS min_seq_len_oom,
       MAX(CASE WHEN status = 'succeeded' THEN peak_memory_bytes_per_chip END)
           AS max_peak_memory_bytes_per_chip,
       COUNT(*) AS trials
FROM results
WHERE status IN ('succeeded', 'oom')
GROUP BY {grid}, batch_size, framework, mode, chips
"""


# The views this revision creates, by the names views_of reads (0003's downgrade restores them).
BEST_TOKENS_VIEW = best_tokens_view(GRID_COLUMNS)
MAX_SEQ_LEN_VIEW = max_seq_len_view(GRID_COLUMNS)


def upgrade() -> None:
    drop_views()  # they select from results, whose columns change
    for table in ("trials", "results"):
        with op.batch_alter_table(table) as batch:
            for name, width, default in SETTINGS:
                batch.add_column(sa.Column(name, sa.String(width), nullable=False,
                                           server_default=default))
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("cp_comm_bytes_per_step_per_chip", sa.BigInteger))
        batch.add_column(sa.Column("grad_sync_bytes_per_step_per_chip", sa.BigInteger))
    op.execute(f"UPDATE trials SET key = key || {KEY_SUFFIX}")
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    bind = op.get_bind()
    kept = bind.execute(sa.text(
        "SELECT COUNT(*) FROM trials WHERE param_sharding != 'replicated' OR remat != 'none'"
    )).scalar()
    if kept:
        raise RuntimeError(f"{kept} trial(s) ran with param_sharding or remat other than "
                           "replicated/none; 0001 cannot tell them apart from their twins: "
                           "delete those sweeps before downgrading")
    drop_views()
    op.execute(f"UPDATE trials SET key = substr(key, 1, length(key) - length({KEY_SUFFIX}))")
    with op.batch_alter_table("results") as batch:
        batch.drop_column("grad_sync_bytes_per_step_per_chip")
        batch.drop_column("cp_comm_bytes_per_step_per_chip")
    for table in ("trials", "results"):
        with op.batch_alter_table(table) as batch:
            for name, _, _ in SETTINGS:
                batch.drop_column(name)
    create_views(best_tokens_view(GRID_COLUMNS_0001), max_seq_len_view(GRID_COLUMNS_0001))
