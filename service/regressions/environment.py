"""The environment a result ran in, and what changed in it across a shift."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.core import environment_diff as diff
from service.db.environments import trial_environment


def environment_of_result(session: Session, result_trial_id: int) -> dict[str, Any] | None:
    """The environment (workers.environment: package versions, drivers, accelerator, source)
    the result of trial `result_trial_id` recorded (results.environment_id), None for a
    result written before migration 0012 or without one; every regression's
    `environment_diff` comes from here."""
    _, environment = trial_environment(session=session, trial_id=result_trial_id)
    return None if environment is None else environment.body


def environment_diff(before: dict[str, Any] | None,
                     after: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """{dotted key: {before, after}} for every leaf that differs between two environments
    (service.core.environment_diff, the one comparison the API's diff serves too); None when
    either environment is unknown."""
    if before is None or after is None:
        return None
    return {change.key: {"before": change.before, "after": change.after}
            for change in diff.environment_diff(before, after)}
