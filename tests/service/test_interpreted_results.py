"""Interpreted runs (issue 34 item 1) are a correctness check, never a speed. Over a sweep where
each fused point ran through its kernels' interpreters ten times "faster" than the reference
run beside it (seed.py's traceable figures), on SQLite and PostgreSQL: the planner rests no
figure on them and says why, `--validate` neither holds them out nor trains on them, the
capacity views never pick them, regressions never watch them, and the results API, `gdn-sweep
results` and the run summary list them with their speeds marked `interpreted`."""

from __future__ import annotations

import io
import re

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from gdn_core.interpreted_kernels import INTERPRETED_SUFFIX
from service.cli.commands import results as results_command
from service.cli.main import main as gdn_sweep
from service.db.models import Result
from service.main import create_app
from service.regressions.report import regressions_report
from service.regressions.series import load_series
from service.runs.progress import db_rows, summary_table

from .conftest import api_settings
from .regression_nights import SPEC, nightly_levels, nightly_schedule, run_nights
from .seed import seed_sweep

NOTE = "interpreted kernels: a correctness run, not a speed"
GRID = {"name": "interpreted", "modes": ["p2p"], "chips": [1, 2], "seq_lens": [256, 512],
        "kernels": ["reference", "fused"]}


def fused(trial) -> bool:
    return trial.kernels == "fused"


@pytest.fixture
def sweep_id(session_factory) -> int:
    """GRID seeded: every fused trial interpreted, 10× the tokens/s and a tenth of the step."""
    return seed_sweep(session_factory, **GRID, interpreted_of=fused,
                      speed_of=lambda t: 10.0 if fused(t) else 1.0,
                      step_time_of=lambda t: 0.001 if fused(t) else 0.01 * t.chips)


def trial_ids(session_factory, kernels: str) -> set[int]:
    with session_factory() as session:
        return set(session.scalars(select(Result.trial_id).where(Result.kernels == kernels)))


@pytest.mark.timeout(60)
def test_the_planner_rests_no_figure_on_an_interpreted_run(sweep_id, session_factory, db_url,
                                                            capsys):
    query = {"preset": "tiny", "seq_len": 512, "accelerator": "cpu", "num_layers": 1,
             "dtype": "float32", "max_chips": 2, "frameworks": "torch", "modes": "p2p",
             "param_shardings": "replicated", "remats": "none"}
    with TestClient(create_app(api_settings(db_url))) as client:
        answers = {k: client.get("/api/capacity", params={**query, "kernels": k}).json()
                   for k in ("reference", "fused")}
    interpreted, reference = trial_ids(session_factory, "fused"), trial_ids(session_factory,
                                                                          "reference")
    assert len(interpreted) == len(reference) == 4
    fused_answer = answers["fused"]
    for candidate in fused_answer["candidates"]:
        step, memory = candidate["step_time_s"], candidate["memory_bytes_per_chip"]
        assert step["value"] is None and step["basis"] == "refused", step
        assert NOTE in step["note"] and NOTE in candidate["tokens_per_s_per_chip"]["note"]
        assert memory["basis"] == "predicted" and "the interpreter's" in memory["note"]
        assert not {i for f in ("memory_bytes_per_chip", "step_time_s", "mfu")
                    for i in candidate[f]["trial_ids"]} & interpreted
    assert fused_answer["cheapest"] is None and fused_answer["fastest"] is None
    assert [c for c in fused_answer["caveats"] if c.startswith(NOTE)]
    # the reference plan: measured from its own trials, nothing to say of interpreted ones
    (two,) = [c for c in answers["reference"]["candidates"] if (c["chips"], c["dp"]) == (2, 1)]
    assert two["step_time_s"]["basis"] == "measured"
    assert set(two["step_time_s"]["trial_ids"]) <= reference
    assert not any(NOTE in c for c in answers["reference"]["caveats"])

    # --validate: the held-out seq_len 512 is the reference trials' only
    assert gdn_sweep(["plan", "--db", db_url, "--validate", str(sweep_id)]) == 0
    printed = capsys.readouterr().out
    held = {int(m) for m in re.findall(r"^largest seq_len 512\s+(\d+) ", printed, re.M)}
    assert held and held <= reference
    assert f"4 succeeded trial(s) ({NOTE}: trials " in printed


@pytest.mark.timeout(60)
def test_the_capacity_views_never_pick_an_interpreted_run(sweep_id, db_url, session_factory):
    with session_factory() as session:
        best = session.execute(text(
            "SELECT seq_len, kernels, gdn_kernel, tokens_per_s_per_chip FROM "
            "best_tokens_per_s_per_chip ORDER BY seq_len")).all()
        fit = session.execute(text("SELECT DISTINCT kernels FROM max_seq_len_fit")).all()
    # seed.py: the one-chip reference run is the fastest reference (seq_len tokens/s/chip)
    assert [tuple(r) for r in best] == [(256, "reference", "seed reference torch gdn", 256.0),
                                        (512, "reference", "seed reference torch gdn", 512.0)]
    assert [tuple(r) for r in fit] == [("reference",)]


@pytest.mark.timeout(60)
def test_listings_show_an_interpreted_runs_speeds_as_interpreted(sweep_id, session_factory,
                                                                  db_url):
    with TestClient(create_app(api_settings(db_url))) as client:
        rows = client.get("/api/results", params={"sweep_id": sweep_id, "limit": 100}).json()
    by_kernels = {k: [r for r in rows["data"] if r["kernels"] == k]
                  for k in ("reference", "fused")}
    assert all(r["interpreted"] and r["gdn_kernel"].endswith(INTERPRETED_SUFFIX)
               for r in by_kernels["fused"])
    assert not any(r["interpreted"] for r in by_kernels["reference"])
    # no scaling efficiency from or for an interpreted run; the reference's is there
    assert [r["scaling_efficiency"] for r in by_kernels["fused"]] == [None] * 4
    assert all(r["scaling_efficiency"] for r in by_kernels["reference"] if r["chips"] == 2)

    out = io.StringIO()
    assert results_command(database_url=db_url, out=out, sweep_id=sweep_id, sort="id") == 0
    table = _table(out.getvalue())
    assert len(table) == 8
    for row in table:
        speeds = [row[c] for c in ("tok/s/chip", "step_s", "min_s", "max_s", "mfu%")]
        if row["kernels"] == "fused (interpreted)":
            assert speeds == ["interpreted"] * 5
        else:
            assert row["kernels"] == "reference" and all(float(s) > 0 for s in speeds)
    assert sum(row["kernels"] == "fused (interpreted)" for row in table) == 4

    with session_factory() as session:
        summary = summary_table(db_rows(session, sweep_id)).splitlines()[1:]
    assert len(summary) == 8
    for line in summary:  # tok/s/chip and MFU
        assert line.split().count("interpreted") == (2 if "kernels fused" in line else 0), line

    # a fused run on 2 chips that ran compiled: its speed is one, but its one-chip baseline
    # ran interpreted, so there is no scaling efficiency to give
    with session_factory.begin() as session:
        compiled = session.scalar(select(Result).where(
            Result.kernels == "fused", Result.chips == 2, Result.seq_len == 256))
        compiled.gdn_kernel = "fla-core 0.6.0 chunk_gated_delta_rule"
        compiled_id = compiled.trial_id
    with TestClient(create_app(api_settings(db_url))) as client:
        (row,) = client.get("/api/results", params={"sweep_id": sweep_id, "kernels": "fused",
                                                    "chips": 2, "seq_len_max": 256}).json()["data"]
    assert row["id"] == compiled_id and not row["interpreted"]
    assert row["tokens_per_s_per_chip"] and row["baseline_trial_id"]
    assert row["scaling_efficiency"] is None and row["speedup_vs_one_chip"] is None


def _table(printed: str) -> list[dict[str, str]]:
    """`gdn-sweep results`' rows by column title (cells are right-aligned under titles)."""
    header, *lines = printed.splitlines()[:-1]
    ends, at = [], 0
    for title in header.split():
        at = header.index(title, at) + len(title)
        ends.append((title, at))
    return [{title: line[start:end].strip() for (title, end), start
             in zip(ends, [0] + [e for _, e in ends[:-1]])} for line in lines]


@pytest.mark.timeout(60)
def test_regressions_never_watch_an_interpreted_series(session_factory):
    """A schedule's fused series, interpreted, slows down 30% from night 7; the reference
    series beside it is steady: nothing to report, and one series only."""
    schedule_id = nightly_schedule(session_factory, spec={
        **SPEC, "seq_lens": [64], "kernels": ["reference", "fused"]})
    fla = "fla-core 0.6.0 chunk_gated_delta_rule" + INTERPRETED_SUFFIX
    run_nights(session_factory, {
        "shifted": nightly_levels(11, 12, slowdown_from=7, factor=1.3),
        "steady": nightly_levels(12, 12)}, shifted="kernels=fused",
        gdn_kernel_of=lambda key: fla if "kernels=fused" in key else None)
    with session_factory() as session:
        report = regressions_report(session=session, schedule_ids=[schedule_id])
        series = load_series(session=session, schedule_ids=[schedule_id])
        stored = session.scalar(select(Result.gdn_kernel).where(Result.kernels == "fused"))
    assert stored == fla  # the interpreted rows are there; detection leaves them out
    assert report.series == 1 and report.count == 0 and report.improvements == []
    assert [("kernels=fused" in s.key, len(s.runs)) for s in series] == [(False, 12)]
