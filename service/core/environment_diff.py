"""What changed between two trials' environments (workers.environment): a pure function, for
`GET /api/environments/diff` and for anything that explains a change in the numbers (a
regression detector names the package or driver that moved).

Nested keys are compared leaf by leaf under dotted names (`packages.torch`,
`runtime.cuda`, `source.schedule_id`); a key one side lacks reads as None on that side, and
`present` says which sides have it, so "absent" and "recorded as null" stay apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


class EnvironmentChange(BaseModel):
    """One key whose value differs between two environments."""

    key: str
    """Dotted path of the leaf, e.g. "packages.torch"."""
    before: Any = None
    after: Any = None
    present: tuple[bool, bool] = (True, True)
    """Whether each side has the key at all (False: a key that side did not record)."""


def flatten(environment: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value} of a nested environment (an empty mapping is a leaf)."""
    leaves: dict[str, Any] = {}
    for key, value in environment.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            leaves.update(flatten(value, f"{name}."))
        else:
            leaves[name] = value
    return leaves


def environment_diff(before: Mapping[str, Any],
                     after: Mapping[str, Any]) -> list[EnvironmentChange]:
    """The leaves that differ between `before` and `after`, sorted by key; [] when equal."""
    old, new = flatten(before), flatten(after)
    return [EnvironmentChange(key=key, before=old.get(key), after=new.get(key),
                              present=(key in old, key in new))
            for key in sorted(old.keys() | new.keys())
            if key not in old or key not in new or old[key] != new[key]]


__all__ = ["EnvironmentChange", "environment_diff", "flatten"]
