"""`gdn-sweep bench planner-validate` (service/bench/planner_validate.py): the protocol's
sweep, its database refusal, the scopes its goal is judged on, and (slow) a small run of the
whole command, sweep and `plan --validate`, end to end."""

from __future__ import annotations

import pytest

from service.bench.planner_validate import goal_table, main, parser, sweep_spec
from service.cli.main import main as gdn_sweep
from service.planner.validate import HeldOut
from workers.sweep_spec import SweepSpec


def test_the_protocol_sweep_is_valid_and_keeps_steps_over_100_ms_by_default():
    """The default sweep validates as `gdn-sweep run` reads it; its shortest point, one chip
    × 4,096 tokens, measured 0.14 s on this host's core (the module docstring)."""
    spec = SweepSpec.model_validate(sweep_spec(parser().parse_args([])))
    assert spec.seq_lens == [4096, 6144, 8192, 12288, 16384] and spec.chips == [1, 2, 4]
    assert (spec.repeats, spec.steps, spec.frameworks, spec.modes) == (5, 10, ["jax"], ["p2p"])


def test_an_existing_database_is_refused(tmp_path, capsys):
    db = tmp_path / "old.db"
    db.write_bytes(b"")
    assert main(["--db", str(db)]) == 2
    assert f"--db {db} exists" in capsys.readouterr().err


def test_it_is_dispatched_by_gdn_sweep_bench(capsys):
    with pytest.raises(SystemExit) as stop:
        gdn_sweep(["bench", "planner-validate", "--help"])
    assert stop.value.code == 0
    assert "seq_len hold-outs" in capsys.readouterr().out


def _row(holdout: str, chips: int, error: float) -> HeldOut:
    return HeldOut(holdout=holdout, trial_id=chips, point=f"measure/jax/p2p/chips={chips}",
                   chips=chips, figure="step_time_s", predicted=1 + error, observed=1.0,
                   error=error, basis="interpolated")


def test_the_goal_is_judged_on_seq_len_holdouts_of_chips_with_a_core_each():
    """Of seq_len hold-outs at chips 1, 2 (≤ 2 cores) and 4 (sharing cores) and the chip-count
    hold-out, only the first scope is judged; the others are reported with their errors."""
    rows = [_row("seq_len 8192", 1, 0.01), _row("largest seq_len 16384", 2, 0.08),
            _row("seq_len 8192", 4, 0.30), _row("largest chips (4)", 4, 0.60),
            _row("largest seq_len 16384", 1, 0.03)]
    (goal, judged, s), (shared, shared_judged, t), (chips, _, u) = goal_table(rows, cores=2)
    assert judged and not shared_judged and "(the goal)" in goal and "share cores" in shared
    assert (s["trials"], s["median_error"], s["max_error"]) == (3, 0.03, 0.08)
    assert s["median_meets_goal"] and s["every_point_meets_goal"]
    assert (t["trials"], t["max_error"]) == (1, 0.30) and not t["every_point_meets_goal"]
    assert (u["trials"], u["max_error"]) == (1, 0.60) and "chip-count" in chips


@pytest.mark.slow  # eight short JAX trials and Ray's start, in processes of their own
@pytest.mark.timeout(900)
def test_a_small_protocol_runs_end_to_end(tmp_path, capfd):
    """Lengths 1,024 and 2,048 on chips 1 and 2, two repeats: the sweep is recorded into the
    new file, `plan --validate` prints the held-out table, the scopes follow, and steps under
    100 ms are named (these are)."""
    db = tmp_path / "small.db"
    assert main(["--db", str(db), "--seq-lens", "1024", "2048", "--chips", "1", "2",
                 "--steps", "2", "--warmup-steps", "1", "--repeats", "2"]) == 0
    out = capfd.readouterr().out
    print(out)
    assert db.exists() and "before: load average" in out and "after: load average" in out
    assert "largest seq_len 2048" in out and "step_time_s" in out  # plan --validate's table
    assert "seq_len hold-outs, chips ≤" in out and "median" in out
    assert "steps under 100 ms" in out
