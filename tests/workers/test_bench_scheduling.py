"""`gdn-sweep bench scheduling`: the cold/warm decomposition of Ray's per-trial overhead."""

from __future__ import annotations

import pytest

from workers.bench_scheduling import bench_shape, format_table, main
from workers.options import DriverOptions

from .conftest import assert_no_leaks


@pytest.mark.slow  # 15-21 s: a benchmark's own check, cold and warm trials
@pytest.mark.timeout(180)
def test_the_bench_decomposes_cold_and_warm_trials(local_ray, capsys):
    row = bench_shape("torch", 2, seq_len=64, steps=2, repeats=2, options=DriverOptions())
    assert row["chips"] == 2
    assert all(row[k] >= 0 for k in row)
    # The cold overhead contains its parts; whether warm beats cold is the bench's figure to
    # print, not a margin to assert between two timings on shared cores.
    assert row["cold_ovh"] >= row["placement"] + row["start+pg"]
    assert row["step"] > 0 and row["warm_trial"] >= row["step"]
    table = format_table([row])
    assert table.splitlines()[0].split() == ["chips", "placement", "start+pg", "cold_ovh",
                                             "warm_ovh", "ray_rtt", "step", "warm_trial"]
    assert main(["--chips", "1", "--repeats", "1", "--steps", "1"]) == 0
    assert "warm_trial" in capsys.readouterr().out
    assert_no_leaks()
