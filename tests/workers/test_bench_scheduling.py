"""`gdn-sweep bench scheduling`: the cold/warm decomposition of Ray's per-trial overhead."""

from __future__ import annotations

import pytest

from workers.bench_scheduling import bench_shape, format_table, main
from workers.options import DriverOptions

from .conftest import assert_no_leaks


@pytest.mark.timeout(180)
def test_warm_trials_skip_placement_and_start(local_ray, capsys):
    row = bench_shape("torch", 2, seq_len=64, steps=2, repeats=2, options=DriverOptions())
    assert row["chips"] == 2
    assert all(row[k] >= 0 for k in row)
    # Reusing the actors is the point: a warm trial costs less than placing and starting them.
    assert row["warm_ovh"] < row["cold_ovh"] and row["warm_ovh"] < row["start+pg"] + 1.0
    assert row["step"] > 0 and row["warm_trial"] >= row["step"]
    table = format_table([row])
    assert table.splitlines()[0].split() == ["chips", "placement", "start+pg", "cold_ovh",
                                             "warm_ovh", "ray_rtt", "step", "warm_trial"]
    assert main(["--chips", "1", "--repeats", "1", "--steps", "1"]) == 0
    assert "warm_trial" in capsys.readouterr().out
    assert_no_leaks()
