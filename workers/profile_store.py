"""Where profile traces live: files under the artifact directory, named per trial, that a
result refers to by a path relative to that directory (so the directory can move), kept
within a retention limit.

A nightly profiled schedule would otherwise grow the disk without bound. Before a trace is
written the store removes traces older than the limit's age, then the oldest until the new
one fits under its bytes, and logs what it removed; a trace is not written (the profile is
`skipped`, the reason given, the trial's result stored all the same) when it alone exceeds
the limit or would leave the disk with less than its minimum free. A result whose trace was
removed keeps its row; the download says the file is gone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

from .profiling import SUFFIX, CapturedProfile
from .result import TrialProfile

log = logging.getLogger(__name__)
ARTIFACT_DIR_ENV = "GDN_SWEEP_ARTIFACT_DIR"
"""Overrides the default artifact directory (driver and service read it alike)."""
PROFILES = "profiles"
"""The traces' folder under the artifact directory."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")
GIB = 2 ** 30


def default_artifact_dir() -> str:
    """$GDN_SWEEP_ARTIFACT_DIR, else ~/.cache/gdn-sweep/artifacts."""
    return os.environ.get(ARTIFACT_DIR_ENV) or str(
        Path.home() / ".cache" / "gdn-sweep" / "artifacts")


@dataclasses.dataclass(frozen=True, slots=True)
class ProfileRetention:
    """How much of the artifact directory profile traces may hold. The defaults keep a month
    of nightly profiles of a few trials each (a trace is 1-100 MB)."""

    max_bytes: int = 20 * GIB
    """All traces together (GDN_SWEEP_PROFILE_MAX_BYTES); the oldest go first beyond it."""
    max_age_days: float = 30.0
    """Traces older than this are removed (GDN_SWEEP_PROFILE_MAX_AGE_DAYS)."""
    min_free_bytes: int = GIB
    """A trace that would leave its disk less free than this is not written
    (GDN_SWEEP_PROFILE_MIN_FREE_BYTES)."""

    @classmethod
    def from_env(cls) -> ProfileRetention:
        """The limits the service's settings read, from the same variables."""
        env = {"max_bytes": ("GDN_SWEEP_PROFILE_MAX_BYTES", int),
               "max_age_days": ("GDN_SWEEP_PROFILE_MAX_AGE_DAYS", float),
               "min_free_bytes": ("GDN_SWEEP_PROFILE_MIN_FREE_BYTES", int)}
        return cls(**{field: kind(os.environ[name]) for field, (name, kind) in env.items()
                      if os.environ.get(name)})


def held_traces(artifact_dir: str) -> list[tuple[float, int, Path]]:
    """(modified time, bytes, path) of every stored trace, oldest first."""
    root = Path(artifact_dir).expanduser() / PROFILES
    found = []
    for path in root.rglob("*") if root.is_dir() else ():
        try:
            stat = path.stat()
        except FileNotFoundError:  # removed meanwhile by another driver
            continue
        if path.is_file():
            found.append((stat.st_mtime, stat.st_size, path))
    return sorted(found)


def enforce_retention(artifact_dir: str, retention: ProfileRetention, *,
                      incoming_bytes: int = 0, now: float | None = None) -> list[Path]:
    """Remove traces past the age limit, then the oldest until `incoming_bytes` more fit
    under the bytes limit; the paths removed (logged)."""
    now = time.time() if now is None else now
    held = held_traces(artifact_dir)
    total = sum(size for _, size, _ in held)
    removed, freed = [], 0
    for modified, size, path in held:
        too_old = now - modified > retention.max_age_days * 86400
        if not too_old and total - freed + incoming_bytes <= retention.max_bytes:
            break  # oldest first: the rest are younger and fit
        path.unlink(missing_ok=True)
        removed.append(path)
        freed += size
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    if removed:
        log.info("profile retention removed %d trace(s), %.1f MiB, oldest first (limits: %.1f "
                 "GiB, %g days): %s", len(removed), freed / 2 ** 20, retention.max_bytes / GIB,
                 retention.max_age_days, ", ".join(p.name for p in removed[:5])
                 + (" …" if len(removed) > 5 else ""),
                 extra={"event": "profiles_removed", "traces": len(removed), "bytes": freed})
    return removed


def _no_room(size: int, root: Path, retention: ProfileRetention) -> str | None:
    """Why a trace of `size` bytes cannot be kept under `root`, or None."""
    if size > retention.max_bytes:
        return (f"the trace ({size / 2 ** 20:.1f} MiB) is larger than the retention limit "
                f"GDN_SWEEP_PROFILE_MAX_BYTES ({retention.max_bytes / 2 ** 20:.1f} MiB)")
    free = shutil.disk_usage(root).free
    if free - size < retention.min_free_bytes:
        return (f"the artifact directory {root} is full: {free / GIB:.2f} GiB free, and the "
                f"trace ({size / 2 ** 20:.1f} MiB) would leave less than "
                f"GDN_SWEEP_PROFILE_MIN_FREE_BYTES ({retention.min_free_bytes / GIB:.2f} GiB)")
    return None


def store_profile(captured: CapturedProfile, *, artifact_dir: str, trial_key: str,
                  retention: ProfileRetention | None = None) -> TrialProfile:
    """Write the captured trace under `artifact_dir` (profiles/<date>/<unique>-<key><suffix>,
    never overwriting) within `retention` (default: from the environment) and describe it;
    a capture without data (the profiler failed) writes nothing and keeps its error; one
    with no room is `skipped`, saying why."""
    if not captured.data:
        return TrialProfile(format=captured.format, summary=captured.summary, status="failed",
                            error=captured.error or "the profiler produced no trace")
    retention = retention or ProfileRetention.from_env()
    root = Path(artifact_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    enforce_retention(artifact_dir, retention, incoming_bytes=len(captured.data))
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    name = f"{uuid.uuid4().hex[:12]}-{_UNSAFE.sub('_', trial_key)[:120]}{SUFFIX[captured.format]}"
    relative = Path(PROFILES) / today / name
    target = root / relative
    why = _no_room(len(captured.data), root, retention)
    if why is None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as out:  # "x": a name is never reused
                out.write(captured.data)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            target.unlink(missing_ok=True)  # no half-written trace
            why = f"the artifact directory {root} is full ({os.strerror(err.errno)})"
    if why is not None:
        log.warning("profile of %s skipped: %s", trial_key, why,
                    extra={"event": "profile_skipped", "trial_key": trial_key})
        return TrialProfile(format=captured.format, summary=captured.summary,
                            status="skipped", error=f"profile skipped: {why}")
    return TrialProfile(path=relative.as_posix(), bytes=len(captured.data), status="stored",
                        format=captured.format, summary=captured.summary, error=captured.error)


def artifact_path(artifact_dir: str, relative: str) -> Path:
    """The file `relative` names under `artifact_dir`; ValueError if it points outside."""
    root = Path(artifact_dir).expanduser().resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"artifact path {relative!r} points outside the artifact directory")
    return path


__all__ = ["ARTIFACT_DIR_ENV", "ProfileRetention", "artifact_path", "default_artifact_dir",
           "enforce_retention", "held_traces", "store_profile"]
