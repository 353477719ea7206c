"""Profile traces within their retention limit (issue 37 item 3), on the real disk: the oldest
traces go first when the bytes limit is reached, traces past the age limit go whatever the
bytes, each removal is logged; a trace with no room (a full disk, or larger than the limit)
is not written and the profile is `skipped` with the reason, while a profiled trial run
through Ray keeps its result."""

from __future__ import annotations

import logging
import os
import time

import pytest

from workers.driver import run_trials
from workers.grid import expand_trials
from workers.options import DriverOptions
from workers.profile_store import ProfileRetention, held_traces, store_profile
from workers.profiling import CHROME_TRACE, CapturedProfile

from .conftest import MemorySink, tiny_spec

KIB = 1024
NO_DISK_HAS = 10 ** 18
"""Free bytes no disk has (an exabyte): a minimum that makes any disk full, whatever other
processes free or fill meanwhile."""


def _capture(size: int) -> CapturedProfile:
    return CapturedProfile(format=CHROME_TRACE, data=os.urandom(size), summary={"wall_s": 1.0})


def _store(root, size, retention, key="t"):
    return store_profile(_capture(size), artifact_dir=str(root), trial_key=key,
                         retention=retention)


def _age(root, relative: str, days: float) -> None:
    then = time.time() - days * 86400
    os.utime(root / relative, (then, then))


def test_the_oldest_traces_go_first_and_the_removal_is_logged(tmp_path, caplog):
    retention = ProfileRetention(max_bytes=30 * KIB, max_age_days=30, min_free_bytes=0)
    stored = [_store(tmp_path, 10 * KIB, retention, key=f"t{i}") for i in range(3)]
    for i, profile in enumerate(stored):  # t0 oldest
        assert profile.status == "stored" and profile.bytes == 10 * KIB
        _age(tmp_path, profile.path, days=3 - i)
    with caplog.at_level(logging.INFO, logger="workers.profile_store"):
        newest = _store(tmp_path, 15 * KIB, retention, key="t3")
    assert newest.status == "stored"
    left = {p.relative_to(tmp_path).as_posix() for _, _, p in held_traces(str(tmp_path))}
    assert left == {stored[2].path, newest.path}  # t0 and t1 made room, t2 stays
    assert sum(size for _, size, _ in held_traces(str(tmp_path))) <= retention.max_bytes
    (record,) = [r for r in caplog.records if getattr(r, "event", "") == "profiles_removed"]
    assert record.traces == 2 and record.bytes == 20 * KIB
    assert "removed 2 trace(s)" in record.getMessage()


def test_traces_past_the_age_limit_go_whatever_the_bytes(tmp_path):
    retention = ProfileRetention(max_bytes=10 ** 9, max_age_days=7, min_free_bytes=0)
    old, recent = (_store(tmp_path, KIB, retention, key=k) for k in ("old", "recent"))
    _age(tmp_path, old.path, days=8)
    _age(tmp_path, recent.path, days=6)
    _store(tmp_path, KIB, retention, key="new")
    names = {p.name for _, _, p in held_traces(str(tmp_path))}
    assert not (tmp_path / old.path).exists() and (tmp_path / recent.path).exists()
    assert len(names) == 2


def test_a_full_disk_or_an_oversized_trace_is_skipped_and_nothing_is_written(tmp_path):
    full = ProfileRetention(max_bytes=10 ** 12, max_age_days=30, min_free_bytes=NO_DISK_HAS)
    skipped = _store(tmp_path, KIB, full)
    assert (skipped.status, skipped.path, skipped.bytes) == ("skipped", None, None)
    assert skipped.error.startswith(f"profile skipped: the artifact directory {tmp_path} is "
                                    "full")
    assert "GDN_SWEEP_PROFILE_MIN_FREE_BYTES" in skipped.error
    assert skipped.summary == {"wall_s": 1.0}  # what the profiler saw is kept
    oversized = _store(tmp_path, 4 * KIB, ProfileRetention(max_bytes=2 * KIB, min_free_bytes=0))
    assert oversized.status == "skipped" and "GDN_SWEEP_PROFILE_MAX_BYTES" in oversized.error
    assert held_traces(str(tmp_path)) == []


def test_the_limits_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("GDN_SWEEP_PROFILE_MAX_BYTES", "12345")
    monkeypatch.setenv("GDN_SWEEP_PROFILE_MAX_AGE_DAYS", "2.5")
    assert ProfileRetention.from_env() == ProfileRetention(max_bytes=12345, max_age_days=2.5)
    assert DriverOptions().profile_retention.max_bytes == 12345


@pytest.mark.timeout(180)
def test_a_profiled_trial_with_no_room_keeps_its_result(local_ray, tmp_path):
    spec = tiny_spec(chips=[2], one_chip_baseline=False, steps=2, profile=True)
    full = ProfileRetention(min_free_bytes=NO_DISK_HAS)
    sink = MemorySink()
    run_trials(expand_trials(spec), sink, name=spec.name, options=DriverOptions(
        artifact_dir=str(tmp_path / "artifacts"), profile_retention=full))
    (result,) = sink.results
    assert result.status == "succeeded", result.error
    assert result.metrics.step_time_s > 0 and result.metrics.measured_steps == 2
    assert result.profile.status == "skipped" and "is full" in result.profile.error
    assert result.profile.summary["op_events"] > 0  # the profiler ran; only the file is gone
    assert held_traces(str(tmp_path / "artifacts")) == []
