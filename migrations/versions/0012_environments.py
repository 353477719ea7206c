"""Environments (issue 25): what each trial measured in, stored once per distinct one.

- `environments`: id, `content_hash` (SHA-256 of the body's canonical JSON, unique: trials
  that share an environment share the row, however many insert it at once), `body` (JSON:
  packages, project commit, device runtime, hosts, the sweep's source; workers.environment),
  `created_at`.
- `results.environment_id` → environments.id, nullable: results stored before this revision
  recorded no environment and keep NULL (their `versions` column is all they have).

Plain ALTER TABLE on both databases (SQLite takes a column with REFERENCES when its default is
NULL): a batch table copy would drop the results triggers of 0005.

Revision ID: 0012_environments
Revises: 0010_data_parallel
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_environments"
down_revision = "0010_data_parallel"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("content_hash", name="uq_environments_content_hash"),
    )
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE results ADD COLUMN environment_id INTEGER "
                   "CONSTRAINT fk_results_environment_id REFERENCES environments (id)")
    else:
        op.add_column("results", sa.Column("environment_id", sa.Integer))
        op.create_foreign_key("fk_results_environment_id", "results", "environments",
                              ["environment_id"], ["id"])
    op.create_index("ix_results_environment_id", "results", ["environment_id"])


def downgrade() -> None:
    op.drop_index("ix_results_environment_id", table_name="results")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("fk_results_environment_id", "results", type_="foreignkey")
    op.execute("ALTER TABLE results DROP COLUMN environment_id")
    op.drop_table("environments")
