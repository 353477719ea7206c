"""`gdn-sweep plan --fit` records its compiles as plan trials of one sweep in the database
the CLI points at, and a later `gdn-sweep plan` reads them as evidence."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from service.cli.main import main as gdn_sweep
from service.db.engine import make_engine, make_session_factory
from service.db.models import Result, Sweep, Trial

FIT = ["plan", "--fit", "--preset", "tiny", "--num-layers", "1", "--seq-len", "512",
       "--accelerator", "cpu", "--dtype", "float32", "--chips", "2", "--mode", "p2p",
       "--chip-memory-gib", "1000"]
PLAN = ["plan", "--preset", "tiny", "--num-layers", "1", "--seq-len", "512", "--accelerator",
        "cpu", "--dtype", "float32", "--max-chips", "2", "--mode", "p2p", "--param-sharding",
        "replicated", "--remat", "none", "--json"]


def _probe(request: dict, seq_len: int) -> dict:
    """A StepPlan's JSON as `python -m gdn_core.jax_gdn.plan` prints it (made-up figures)."""
    return {"chips": request["chips"], "dp": request["dp"], "seq_len": seq_len,
            "estimated_memory_bytes": 1_000_000 + 1_000 * seq_len * request["dp"],
            "argument_bytes": 1, "temp_bytes": 1, "matmul_flops_per_chip": 10 ** 6 * seq_len,
            "trip_count_unknown": False, "cp_comm_bytes_per_step": 4096 * (request["dp"] == 1),
            "grad_sync_bytes_per_step": 8192, "compile_time_s": 1.5, "backend": "cpu (cpu)"}


def _fake_bisection(request, *, budget_bytes, max_seq_len, **_):
    """What a budget nothing reaches makes the real search compile: one granule, then the
    top (it fits, so the search ends)."""
    granule = 64 * request["chips"] // request["dp"]
    probes = [_probe(request, granule), _probe(request, max_seq_len)]
    return {"budget_bytes": budget_bytes, "granule": granule, "fits": probes[-1],
            "exceeds": None, "probes": probes}


def _rows(url: str):
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            sweeps = list(session.scalars(select(Sweep)))
            results = list(session.scalars(select(Result).order_by(Result.trial_id)))
            trials = list(session.scalars(select(Trial).order_by(Trial.id)))
            return sweeps, results, trials
    finally:
        engine.dispose()


def _by_mesh(url: str, capsys) -> dict:
    assert gdn_sweep([*PLAN, "--db", url]) == 0
    answer = json.loads(capsys.readouterr().out)
    return {(c["chips"], c["dp"]): c for c in answer["candidates"]}


@pytest.mark.timeout(60)
def test_fit_compiles_are_stored_as_a_sweep_of_plan_trials(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("workers.plan_runner.plan_in_fresh_process", _fake_bisection)
    url = f"sqlite:///{tmp_path / 'fit.db'}"
    before = _by_mesh(url, capsys)  # nothing recorded yet: the analytic prediction
    assert before[2, 1]["memory_bytes_per_chip"]["basis"] == "predicted"

    assert gdn_sweep([*FIT, "--dp", "1", "--dp", "2", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "recorded 4 compile(s) as plan trials of sweep" in out
    (sweep,), results, trials = _rows(url)
    assert sweep.status == "finished" and sweep.trials_total == 4
    assert sweep.runner.startswith("plan-fit@")  # who wrote it, as `gdn-sweep run` records
    assert sweep.spec["kinds"] == ["plan"] and sweep.spec["dp"] == [1, 2]
    assert sweep.spec["seq_lens"] == [64, 128, 512]
    assert sorted(t.key for t in trials) == sorted([
        f"plan/jax/{mesh}/seq_len={n}/dtype=float32/param_sharding=replicated/remat=none"
        for mesh, n in (("p2p/chips=2", 128), ("p2p/chips=2", 512),
                        ("none/chips=2/dp=2", 64), ("none/chips=2/dp=2", 512))])
    assert {r.status for r in results} == {"succeeded"} and {r.kind for r in results} == {"plan"}
    at_512 = {r.dp: r for r in results if r.seq_len == 512}
    assert at_512[1].estimated_memory_bytes_per_chip == 1_000_000 + 512_000
    assert "XLA:CPU compile for 2 virtual chips" in at_512[1].estimated_memory_source
    assert at_512[2].grad_sync_bytes_per_step_per_chip == 8192
    assert at_512[1].step_time_s is None and at_512[1].predicted_memory_bytes_per_chip > 0

    after = _by_mesh(url, capsys)  # the second plan reads them as evidence
    for mesh in ((2, 1), (2, 2)):
        memory = after[mesh]["memory_bytes_per_chip"]
        assert memory["basis"] == "estimated", memory
        assert memory["trial_ids"] == [at_512[mesh[1]].trial_id]
        assert memory["value"] == at_512[mesh[1]].estimated_memory_bytes_per_chip


@pytest.mark.timeout(60)
def test_fit_refuses_bad_input_naming_it_before_compiling(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr("workers.plan_runner.plan_in_fresh_process", never)
    url = f"sqlite:///{tmp_path / 'fit.db'}"
    base = [a for a in FIT if a not in ("cpu",)]
    bad = [*base[:base.index("--accelerator") + 1], "h900",
           *base[base.index("--accelerator") + 1:], "--db", url]
    assert gdn_sweep(bad) == 2 and "'h900'" in capsys.readouterr().err
    assert gdn_sweep([*FIT, "--db", "nonsense://"]) == 2
    assert "nonsense" in capsys.readouterr().err
    three = [*FIT[:FIT.index("--chips") + 1], "3", *FIT[FIT.index("--chips") + 2:]]
    assert gdn_sweep([*three, "--dp", "2", "--no-record"]) == 0
    assert "dp=2 does not divide chips=3" in capsys.readouterr().out
