"""Regression alerts (issue 25): a schedule's webhook and what it was sent.

- `schedules.webhook_url` (an http(s) URL, NULL: no webhook), and its latest delivery:
  `webhook_status` (delivered / failed), `webhook_error`, `webhook_at`.
- `regression_alerts`: one row per regression alerted, unique on (schedule_id, series,
  metric, first_sweep_id), so each regression is POSTed once; its delivery status, attempts
  and error. Deleted with its schedule.

Regressions themselves are computed on read from `results` (service/regressions/report.py):
nothing to backfill.

Revision ID: 0013_regression_alerts
Revises: 0012_environments
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_regression_alerts"
down_revision = "0012_environments"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
_SCHEDULE_COLUMNS = (("webhook_url", sa.String(2000)), ("webhook_status", sa.String(16)),
                     ("webhook_error", sa.Text()), ("webhook_at", TZ))


def upgrade() -> None:
    for name, type_ in _SCHEDULE_COLUMNS:  # plain ALTER TABLE: nullable columns, no copy
        op.add_column("schedules", sa.Column(name, type_))
    op.create_table(
        "regression_alerts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("schedule_id", sa.Integer, sa.ForeignKey("schedules.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("series", sa.String(200), nullable=False),
        sa.Column("metric", sa.String(32), nullable=False),
        sa.Column("first_sweep_id", sa.Integer, nullable=False),
        sa.Column("sweep_id", sa.Integer, nullable=False),
        sa.Column("relative_change", sa.Float, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("delivered_at", TZ),
        sa.UniqueConstraint("schedule_id", "series", "metric", "first_sweep_id",
                            name="uq_regression_alerts_regression"),
    )


def downgrade() -> None:
    op.drop_table("regression_alerts")
    for name, _ in reversed(_SCHEDULE_COLUMNS):
        op.execute(f"ALTER TABLE schedules DROP COLUMN {name}")
