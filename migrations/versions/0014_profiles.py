"""Profiles (issue 25 item 6): a profiled trial's result keeps its trace and a summary.

- results gain `profile_format`, `profile_path` (relative to the service's artifact
  directory), `profile_bytes`, `profile_summary` (JSON: top ops by self time; compute,
  collective and idle seconds of the profiled step) and `profile_error`, all NULL for every
  existing row (nothing was profiled) and for unprofiled trials.
- The profile is one extra step after the measured ones: no metric column changes meaning,
  and no trial key changes (`SweepSpec.profile` is no grid dimension; stored specs lack it
  and default to false).
- The views select named columns, so they are left as they are.

Revision ID: 0014_profiles
Revises: 0013_regression_alerts
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_profiles"
down_revision = "0013_regression_alerts"
branch_labels = None
depends_on = None

COLUMNS = (
    ("profile_format", sa.String(32)),
    ("profile_path", sa.String(500)),
    ("profile_bytes", sa.BigInteger()),
    ("profile_summary", sa.JSON()),
    ("profile_error", sa.Text()),
)


def upgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    for name, type_ in COLUMNS:
        op.add_column("results", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    # The trace files stay under the artifact directory; only the rows' references go.
    for name, _ in reversed(COLUMNS):
        op.execute(f"ALTER TABLE results DROP COLUMN {name}")
