"""Schedules: saved sweep definitions run on a cron expression in an IANA time zone.

- `schedules`: name, cron, timezone, the sweep spec, paused, allow_overlap, next_run_at
  (UTC; NULL while paused), last_run_at.
- `schedule_runs`: one row per due time fired, primary key (schedule_id, due_at), so exactly
  one process claims it; the sweep it created (NULL when skipped), the outcome.
- `sweeps.schedule_id`: the schedule that created the sweep (SET NULL when it is deleted).

Revision ID: 0007_schedules
Revises: 0006_plan_trials
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_schedules"
down_revision = "0006_plan_trials"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("allow_overlap", sa.Boolean, nullable=False),
        sa.Column("next_run_at", TZ),
        sa.Column("last_run_at", TZ),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    )
    op.create_index("ix_schedules_next_run_at", "schedules", ["next_run_at"])
    op.create_table(
        "schedule_runs",
        sa.Column("schedule_id", sa.Integer, sa.ForeignKey("schedules.id", ondelete="CASCADE"),
                  primary_key=True, autoincrement=False),
        sa.Column("due_at", TZ, primary_key=True),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="SET NULL")),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", TZ, nullable=False),
    )
    # SQLite: batch mode rebuilds `sweeps` (foreign keys are off during migrations, env.py)
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("schedule_id", sa.Integer))
        batch.create_foreign_key("fk_sweeps_schedule_id", "schedules", ["schedule_id"], ["id"],
                                 ondelete="SET NULL")
        batch.create_index("ix_sweeps_schedule_id", ["schedule_id"])


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_index("ix_sweeps_schedule_id")
        batch.drop_constraint("fk_sweeps_schedule_id", type_="foreignkey")
        batch.drop_column("schedule_id")
    op.drop_table("schedule_runs")
    op.drop_index("ix_schedules_next_run_at", table_name="schedules")
    op.drop_table("schedules")
