"""The summary table `gdn-sweep run` prints at the end: each trial one line, and no two points of
a sweep read alike, whichever dimensions it crosses (from the database and from a results file
that has none of them yet)."""

from __future__ import annotations

import re

import pytest

from service.db.models import Trial
from service.runs.progress import db_rows, file_rows, summary_table
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP
from .seed import seed_sweep

# Every dimension beside framework, mode, chips and seq_len, each with two values.
CROSSED = dict(modes=["p2p"], chips=[1, 2], seq_lens=[64], dp=[1, 2],
               dtypes=["float32", "bfloat16"], layers=["hybrid"], attn_cps=["ring", "all_gather_kv"],
               layouts=["contiguous", "zigzag"], kernels=["reference", "fused"],
               documents=["single", "uniform:8-24"], repeats=2)


def point_of(line: str) -> tuple[str, ...]:
    """A summary line's framework, mode, chips, seq_len and settings (columns are two or more
    spaces apart; a settings cell has single spaces only)."""
    return tuple(re.split(r"\s{2,}", line.strip())[:5])


@pytest.mark.timeout(60)
def test_every_point_of_a_crossed_sweep_has_a_line_of_its_own(session_factory, tmp_path):
    sweep_id = seed_sweep(session_factory, **CROSSED)
    with session_factory() as session:
        rows = db_rows(session, sweep_id)
        trials = session.query(Trial).filter(Trial.sweep_id == sweep_id).count()
    assert len(rows) == trials > 40
    table = summary_table(rows).splitlines()
    assert "settings" in table[0]
    points = [point_of(line) for line in table[1:]]
    assert len(set(points)) == len(points), sorted(p for p in points if points.count(p) > 1)
    joined = "\n".join(point[4] for point in points)
    for shown in ("dp 2", "bfloat16", "hybrid", "attn_cp ring", "attn_cp all_gather_kv",
                  "zigzag", "kernels fused", "documents uniform:8-24", "repeat 1"):
        assert shown in joined

    # the same lines before anything ran: from the trials the sweep expands to, no results file
    trials = [t for t in expand_trials(SweepSpec.model_validate({**TINY_SWEEP, **CROSSED}))
              if t.skip_reason is None]
    pending = [point_of(line) for line in summary_table(
        file_rows(tmp_path / "none.jsonl", trials)).splitlines()[1:]]
    assert sorted(pending) == sorted(points)
