"""`cache_versions`: a counter per cached read, bumped by a trigger in the transaction that
changes what the read shows. `results` counts every insert, update or delete of a succeeded
result (GET /api/results shows succeeded results, their attempts and their baselines' results,
all written in that transaction).

Revision ID: 0005_cache_versions
Revises: 0004_idempotency_keys
Create Date: 2027-02-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_cache_versions"
down_revision = "0004_idempotency_keys"
branch_labels = None
depends_on = None

BUMP = "UPDATE cache_versions SET version = version + 1 WHERE name = 'results'"
CONDITIONS = {"insert": "NEW.status = 'succeeded'",
              "update": "OLD.status = 'succeeded' OR NEW.status = 'succeeded'",
              "delete": "OLD.status = 'succeeded'"}


def upgrade() -> None:
    op.create_table(
        "cache_versions",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
    )
    op.execute("INSERT INTO cache_versions (name, version) VALUES ('results', 0)")
    if op.get_context().dialect.name == "postgresql":
        op.execute("CREATE FUNCTION bump_results_version() RETURNS trigger LANGUAGE plpgsql "
                   f"AS $$ BEGIN {BUMP}; RETURN NULL; END $$")
        for event, condition in CONDITIONS.items():
            op.execute(f"CREATE TRIGGER results_{event}_bumps_version AFTER {event.upper()} "
                       f"ON results FOR EACH ROW WHEN ({condition}) "
                       "EXECUTE FUNCTION bump_results_version()")
    else:
        for event, condition in CONDITIONS.items():
            op.execute(f"CREATE TRIGGER results_{event}_bumps_version AFTER {event.upper()} "
                       f"ON results FOR EACH ROW WHEN {condition} BEGIN {BUMP}; END")


def downgrade() -> None:
    for event in CONDITIONS:
        op.execute(f"DROP TRIGGER results_{event}_bumps_version"
                   + (" ON results" if op.get_context().dialect.name == "postgresql" else ""))
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP FUNCTION bump_results_version()")
    op.drop_table("cache_versions")
