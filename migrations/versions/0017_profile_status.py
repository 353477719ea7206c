"""Profile status (issue 37 item 3): a profile is stored, failed or skipped.

Profile traces are now kept within a retention limit (bytes, age, the disk's free minimum:
workers/profile_store.py); a trace with no room is not written and the profile is `skipped`,
its reason in `profile_error`, the trial's measurements stored as ever. `results` gains
`profile_status`; existing profiled rows read back as they were: `stored` where a trace path
is recorded, `failed` where the profiler left none. Unprofiled rows keep NULL. The views
select named columns and are left as they are.

Revision ID: 0017_profile_status
Revises: 0016_interpreted_kernels
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_profile_status"
down_revision = "0016_interpreted_kernels"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35 and PostgreSQL): a batch table copy would drop the
    # results triggers of 0005.
    op.add_column("results", sa.Column("profile_status", sa.String(16), nullable=True))
    op.execute("UPDATE results SET profile_status = CASE WHEN profile_path IS NOT NULL "
               "THEN 'stored' ELSE 'failed' END WHERE profile_format IS NOT NULL")


def downgrade() -> None:
    # A skipped profile reads back as a failed one: no path, its reason in profile_error.
    op.execute("ALTER TABLE results DROP COLUMN profile_status")
