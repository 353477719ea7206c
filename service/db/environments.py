"""Environments in the database: each distinct one stored once, looked up by trial.

`environment_id` inserts the body with INSERT … ON CONFLICT (content_hash) DO NOTHING, then
selects the row: of two writers with the same environment at once, one inserts and the other
finds its row (PostgreSQL: once the first commits; SQLite: one writer at a time), so a sweep's
trials share one row. It runs inside the caller's transaction, the result's own (db_sink).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Environment, Result, utcnow


def content_hash(body: dict[str, Any]) -> str:
    """SHA-256 (hex) of `body` as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def environment_id(*, session: Session, body: dict[str, Any]) -> int:
    """The id of the environments row holding `body`, inserted if none does."""
    digest = content_hash(body)
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    session.execute(insert(Environment).values(content_hash=digest, body=body,
                                               created_at=utcnow())
                    .on_conflict_do_nothing(index_elements=["content_hash"]))
    return session.scalars(select(Environment.id).where(
        Environment.content_hash == digest)).one()


def get_environment(*, session: Session, environment_id: int) -> Environment | None:
    return session.get(Environment, environment_id)


def trial_environment(*, session: Session, trial_id: int) -> tuple[bool, Environment | None]:
    """(whether trial `trial_id` has a result, the environment that result recorded)."""
    row = session.execute(select(Result.trial_id, Environment).select_from(Result)
                          .outerjoin(Environment, Environment.id == Result.environment_id)
                          .where(Result.trial_id == trial_id)).first()
    return (False, None) if row is None else (True, row[1])


__all__ = ["content_hash", "environment_id", "get_environment", "trial_environment"]
