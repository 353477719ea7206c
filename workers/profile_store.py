"""Where profile traces live: files under the artifact directory, named per trial, that a
result refers to by a path relative to that directory (so the directory can move)."""

from __future__ import annotations

import datetime as dt
import os
import re
import uuid
from pathlib import Path

from .profiling import SUFFIX, CapturedProfile
from .result import TrialProfile

ARTIFACT_DIR_ENV = "GDN_SWEEP_ARTIFACT_DIR"
"""Overrides the default artifact directory (driver and service read it alike)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")


def default_artifact_dir() -> str:
    """$GDN_SWEEP_ARTIFACT_DIR, else ~/.cache/gdn-sweep/artifacts."""
    return os.environ.get(ARTIFACT_DIR_ENV) or str(
        Path.home() / ".cache" / "gdn-sweep" / "artifacts")


def store_profile(captured: CapturedProfile, *, artifact_dir: str, trial_key: str) -> TrialProfile:
    """Write the captured trace under `artifact_dir` (profiles/<date>/<unique>-<key><suffix>,
    never overwriting) and describe it; a capture without data (the profiler failed) writes
    nothing and keeps its error."""
    if not captured.data:
        return TrialProfile(format=captured.format, summary=captured.summary,
                            error=captured.error or "the profiler produced no trace")
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    name = f"{uuid.uuid4().hex[:12]}-{_UNSAFE.sub('_', trial_key)[:120]}{SUFFIX[captured.format]}"
    relative = Path("profiles") / today / name
    target = Path(artifact_dir).expanduser() / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "xb") as out:  # "x": a name is never reused
        out.write(captured.data)
    return TrialProfile(path=relative.as_posix(), bytes=len(captured.data),
                        format=captured.format, summary=captured.summary, error=captured.error)


def artifact_path(artifact_dir: str, relative: str) -> Path:
    """The file `relative` names under `artifact_dir`; ValueError if it points outside."""
    root = Path(artifact_dir).expanduser().resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"artifact path {relative!r} points outside the artifact directory")
    return path


__all__ = ["ARTIFACT_DIR_ENV", "artifact_path", "default_artifact_dir", "store_profile"]
