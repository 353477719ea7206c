"""Sweeps, trials (the queue), results (one per trial, the fact table), indexes, views.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = """
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT preset, num_layers, accelerator_type, dtype, seq_len, framework, mode, chips, batch_size,
       tokens_per_s_per_chip, mfu, peak_memory_bytes_per_chip, step_time_s,
       trial_id, sweep_id, finished_at
FROM (
    SELECT r.*,
           ROW_NUMBER() OVER (
               PARTITION BY preset, num_layers, accelerator_type, dtype, seq_len
               ORDER BY tokens_per_s_per_chip DESC, trial_id) AS rn
    FROM results r
    WHERE status = 'succeeded' AND tokens_per_s_per_chip IS NOT NULL
) ranked
WHERE rn = 1
"""

MAX_SEQ_LEN_VIEW = """
CREATE VIEW max_seq_len_fit AS
SELECT preset, num_layers, accelerator_type, dtype, batch_size, framework, mode, chips,
       MAX(CASE WHEN status = 'succeeded' THEN seq_len END) AS max_seq_len_succeeded,
       MIN(CASE WHEN status = 'oom' THEN seq_len END) AS min_seq_len_oom,
       MAX(CASE WHEN status = 'succeeded' THEN peak_memory_bytes_per_chip END)
           AS max_peak_memory_bytes_per_chip,
       COUNT(*) AS trials
FROM results
WHERE status IN ('succeeded', 'oom')
GROUP BY preset, num_layers, accelerator_type, dtype, batch_size, framework, mode, chips
"""


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("trials_total", sa.Integer, nullable=False),
        sa.Column("trials_skipped", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        sa.Column("runner", sa.String(128)),
        sa.Column("heartbeat_at", TZ),
    )
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("framework", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("chips", sa.Integer, nullable=False),
        sa.Column("seq_len", sa.Integer, nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("preset", sa.String(64), nullable=False),
        sa.Column("num_layers", sa.Integer, nullable=False),
        sa.Column("vocab_size", sa.Integer, nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("warmup_steps", sa.Integer, nullable=False),
        sa.Column("accelerator_kind", sa.String(8), nullable=False),
        sa.Column("accelerator_type", sa.String(32), nullable=False),
        sa.Column("verify", sa.Boolean, nullable=False),
        sa.Column("timeout_s", sa.Float, nullable=False),
        sa.Column("skip_reason", sa.Text),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("started_at", TZ),
        sa.UniqueConstraint("sweep_id", "key", name="uq_trials_sweep_key"),
    )
    op.create_index("ix_trials_sweep_status", "trials", ["sweep_id", "status"])
    op.create_table(
        "results",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  primary_key=True, autoincrement=False),
        sa.Column("sweep_id", sa.Integer, nullable=False),
        sa.Column("framework", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("chips", sa.Integer, nullable=False),
        sa.Column("seq_len", sa.Integer, nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("preset", sa.String(64), nullable=False),
        sa.Column("num_layers", sa.Integer, nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("accelerator_kind", sa.String(8), nullable=False),
        sa.Column("accelerator_type", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("hosts", sa.JSON, nullable=False),
        sa.Column("versions", sa.JSON, nullable=False),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        *(sa.Column(name, sa.Float) for name in (
            "step_time_s", "tokens_per_s_per_chip", "model_flops_per_step",
            "maxtext_flops_per_step", "hardware_flops_per_step", "peak_flops_per_chip")),
        sa.Column("peak_flops_source", sa.Text),
        sa.Column("mfu", sa.Float),
        sa.Column("hfu", sa.Float),
        sa.Column("peak_memory_bytes_per_chip", sa.BigInteger),
        sa.Column("memory_source", sa.Text),
        sa.Column("comm_bytes_per_step_per_chip", sa.BigInteger),
        sa.Column("loss_first", sa.Float),
        sa.Column("loss_last", sa.Float),
        sa.Column("max_rel_err", sa.Float),
    )
    op.create_index("ix_results_status_preset_accelerator", "results",
                    ["status", "preset", "accelerator_type", "seq_len", "mode", "chips",
                     "framework", "dtype"])
    op.create_index("ix_results_status_mode_chips", "results",
                    ["status", "mode", "chips", "seq_len", "framework", "dtype"])
    op.create_index("ix_results_status_framework", "results",
                    ["status", "framework", "dtype", "mode"])
    op.create_index("ix_results_status_tokens", "results",
                    ["status", "tokens_per_s_per_chip", "trial_id"])
    op.create_index("ix_results_status_mfu", "results", ["status", "mfu", "trial_id"])
    op.create_index("ix_results_sweep_id", "results", ["sweep_id"])
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    drop_views()
    op.drop_table("results")
    op.drop_table("trials")
    op.drop_table("sweeps")
