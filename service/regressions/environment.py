"""The environment a result ran in, and what changed in it across a shift."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session


def environment_of_result(session: Session, result_trial_id: int) -> dict[str, Any] | None:
    """The environment (package versions, drivers, host and container facts) the result of
    trial `result_trial_id` ran in, as a flat {name: value} dict; None while results carry no
    environment. Reads `results.environment_id` once that column exists (migration
    0012_environments); every regression's `environment_diff` comes from here."""
    del session, result_trial_id
    return None


def environment_diff(before: dict[str, Any] | None,
                     after: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """{name: {before, after}} for every entry that differs between two environments (absent
    on one side: None there); None when either environment is unknown."""
    if before is None or after is None:
        return None
    return {name: {"before": before.get(name), "after": after.get(name)}
            for name in sorted(before.keys() | after.keys())
            if before.get(name) != after.get(name)}
