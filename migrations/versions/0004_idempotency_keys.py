"""Idempotency keys of POST /api/sweeps: `idempotency_keys` (the key as primary key, the hash
of the request's spec, the sweep it created; deleted with the sweep).

Revision ID: 0004_idempotency_keys
Revises: 0003_true_metrics
Create Date: 2027-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_idempotency_keys"
down_revision = "0003_true_metrics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("sweep_id", sa.Integer, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
