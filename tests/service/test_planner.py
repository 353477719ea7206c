"""The capacity planner on a database of real trial results this module produces itself: a
measured + plan sweep of the tiny model (chips 1 and 2, three lengths) and a plan sweep over
2, 4 and 8 virtual chips, both run by `gdn-sweep run`'s code on a local Ray."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.cli.main import main as gdn_sweep
from service.core.config import Settings
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Result, Sweep
from service.main import create_app
from service.planner.capacity import EXTRAPOLATION_LIMIT, plan_capacity
from service.planner.evidence import load_observations
from service.schemas.planner import CapacityRequest
from service.runs.run_command import run_sweep_into_db

from .conftest import api_settings, scratch_postgres_database

MODEL = {"preset": "tiny", "num_layers": 1}
MEASURED = {"name": "planner fixture: measured and planned", "kinds": ["measure", "plan"],
            "frameworks": ["jax"], "modes": ["p2p"], "chips": [1, 2],
            "seq_lens": [256, 512, 1024], "model": MODEL, "steps": 3, "warmup_steps": 1,
            "accelerator": {"kind": "cpu", "type": "cpu"}, "trial_timeout_s": 300}
PLANS = {**MEASURED, "name": "planner fixture: plans on 2-8 chips", "kinds": ["plan"],
         "chips": [2, 4, 8], "seq_lens": [1024, 2048, 4096]}


# The fixture runs 21 real trials (about 80 s here): the tests on it are the slow tier's. The
# default tier keeps the planner's API and page on seeded rows (test_dashboard_planner.py), a
# shape given by hand below, and plan trials themselves (tests/workers/test_plan_trials.py).
@pytest.fixture(scope="module")
def planner_db(tmp_path_factory, local_ray) -> str:
    """SQLite URL of a database holding the two sweeps' real results."""
    folder = tmp_path_factory.mktemp("planner")
    url = f"sqlite:///{folder / 'results.db'}"
    settings = Settings(database_url=url, max_concurrent_trials=2)
    for sweep in (MEASURED, PLANS):
        path = folder / "sweep.yaml"
        path.write_text(yaml.safe_dump(sweep))
        assert run_sweep_into_db(path, settings=settings, progress=False) == 0
    return url


def _rows(url: str) -> list[Result]:
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            return list(session.scalars(select(Result).order_by(Result.trial_id)))
    finally:
        engine.dispose()


def _answer(url: str, **request):
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            req = CapacityRequest(**{"preset": "tiny", "accelerator": "cpu", "dtype": "float32",
                                     "num_layers": 1, "modes": ["p2p"],
                                     "param_shardings": ["replicated"], "remats": ["none"],
                                     **request})
            return plan_capacity(load_observations(session, preset="tiny",
                                                   accelerator_type="cpu"), req)
    finally:
        engine.dispose()


def _candidate(answer, chips: int):
    return next(c for c in answer.candidates if c.chips == chips and c.dp == 1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plan_results_hold_estimates_never_peaks(planner_db):
    rows = _rows(planner_db)
    plans = [r for r in rows if r.kind == "plan"]
    measured = [r for r in rows if r.kind == "measure"]
    assert len(plans) == 6 + 9 and len(measured) == 6
    assert all(r.status == "succeeded" for r in rows), [(r.trial_id, r.error) for r in rows]
    for r in plans:
        assert r.peak_memory_bytes_per_chip is None and r.memory_source is None
        assert r.step_time_s is None and r.mfu is None and r.tokens_per_s_per_chip is None
        assert r.estimated_memory_bytes_per_chip > 0 and r.compiled_flops_per_step_per_chip > 0
        assert f"compile for {r.chips} virtual chips" in r.estimated_memory_source
    # The plan and the measured trial of one point compile the same program.
    for m in measured:
        twin = next(p for p in plans if (p.sweep_id, p.mode, p.chips, p.seq_len) ==
                    (m.sweep_id, m.mode, m.chips, m.seq_len))
        assert twin.estimated_memory_bytes_per_chip == m.estimated_memory_bytes_per_chip
        assert m.peak_memory_bytes_per_chip > 0 and m.memory_source.startswith("process_rss")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_results_api_and_csv_show_the_kind(planner_db):
    with TestClient(create_app(api_settings(planner_db))) as client:
        default = client.get("/api/results", params={"limit": 100}).json()
        plans = client.get("/api/results", params={"kind": "plan", "limit": 100}).json()
        both = client.get("/api/results", params=[("kind", "plan"), ("kind", "measure"),
                                                  ("limit", "100")]).json()
        csv = client.get("/api/results", params={"kind": "plan", "format": "csv"}).text
        bad = client.get("/api/results", params={"kind": "guess"})
    assert {t["kind"] for t in default["data"]} == {"measure"} and default["count"] == 6
    assert {t["kind"] for t in plans["data"]} == {"plan"} and plans["count"] == 15
    assert both["count"] == 21
    # Measured first on both backends although plans have no tokens/s (NULLs last).
    assert [t["kind"] for t in both["data"]][:6] == ["measure"] * 6
    header, *lines = csv.strip().splitlines()
    assert "kind" in header.split(",") and "compiled_flops_per_step_per_chip" in header
    assert len(lines) == 15 and all(",plan," in line for line in lines)
    assert bad.status_code == 422 and "measure" in bad.text and "plan" in bad.text


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_capacity_labels_every_figure_with_what_it_rests_on(planner_db):
    rows = {(r.kind, r.chips, r.seq_len): r for r in _rows(planner_db)}
    answer = _answer(planner_db, seq_len=1024, max_chips=8)
    two, four = _candidate(answer, 2), _candidate(answer, 4)
    measured = rows[("measure", 2, 1024)]
    assert two.step_time_s.basis == "measured" and two.step_time_s.value == pytest.approx(
        measured.step_time_s)
    assert two.step_time_s.trial_ids == [measured.trial_id]
    # A CPU process's RSS is no chip's memory: the trial's own XLA estimate stands for it.
    assert two.memory_bytes_per_chip.basis == "estimated"
    assert two.memory_bytes_per_chip.value == measured.estimated_memory_bytes_per_chip
    # No measured trial at 4 chips: memory is the plan's estimate, the time extrapolated past
    # the 2 chips the links were fitted on.
    assert four.memory_bytes_per_chip.basis == "estimated"
    assert four.memory_bytes_per_chip.value == rows[("plan", 4, 1024)].estimated_memory_bytes_per_chip
    assert four.step_time_s.basis == "extrapolated" and four.step_time_s.value > 0
    assert set(four.step_time_s.trial_ids) >= {rows[("measure", 1, 256)].trial_id}
    for c in answer.candidates:
        assert c.mfu.value is None or 0 < c.mfu.value <= 1
    assert answer.fewest_chips.chips == 1  # the tiny model fits one chip
    # Every measured point has a plan beside it: the answer compares the two.
    assert len(answer.plan_checks) >= 6 and all(
        c.ratio == pytest.approx(c.plan_estimate_bytes / c.measured_peak_bytes)
        for c in answer.plan_checks)
    assert answer.pareto[0].chips == 1
    assert_pareto_front(answer.pareto, answer.candidates)
    assert answer.fastest.tokens_per_s.value == max(
        c.tokens_per_s.value for c in answer.candidates if c.fits and c.tokens_per_s.value)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_capacity_refuses_to_extrapolate_past_what_the_data_carries(planner_db):
    answer = _answer(planner_db, seq_len=2 ** 22, max_chips=2)
    one = _candidate(answer, 1)
    assert one.step_time_s.value is None and one.step_time_s.basis == "refused"
    assert f"at most {EXTRAPOLATION_LIMIT}×" in one.step_time_s.note
    assert one.tokens_per_s_per_chip.value is None
    assert one.memory_bytes_per_chip.value > 0  # memory always has the analytic prediction


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_fit_interpolates_a_plan_it_did_not_see_within_five_percent(planner_db):
    """Held out: the plan at 4 chips × 2048 tokens; the fit over the other plans (same mode,
    512 and 1024 local tokens on either side) predicts its memory."""
    held = next(r for r in _rows(planner_db) if (r.kind, r.chips, r.seq_len) == ("plan", 4, 2048))
    engine = make_engine(planner_db)
    try:
        with make_session_factory(engine)() as session:
            observations = [o for o in load_observations(session, preset="tiny",
                                                         accelerator_type="cpu")
                            if o.trial_id != held.trial_id and o.kind == "plan"]
    finally:
        engine.dispose()
    req = CapacityRequest(preset="tiny", accelerator="cpu", dtype="float32", num_layers=1,
                          seq_len=2048, max_chips=4, modes=["p2p"],
                          param_shardings=["replicated"], remats=["none"])
    memory = _candidate(plan_capacity(observations, req), 4).memory_bytes_per_chip
    assert memory.basis == "interpolated"
    assert abs(memory.value - held.estimated_memory_bytes_per_chip) <= (
        0.05 * held.estimated_memory_bytes_per_chip)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_plan_validate_prints_the_error_of_each_held_out_level(planner_db, capsys):
    sweeps = {s.name: s.id for s in _sweeps(planner_db)}
    assert gdn_sweep(["plan", "--db", planner_db, "--validate",
                      str(sweeps[PLANS["name"]])]) == 0
    out = capsys.readouterr().out
    assert "largest chips (8)" in out and "largest seq_len 4096" in out
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    memory = {s["basis"]: s for s in summary if s["figure"] == "memory_bytes_per_chip"}
    interpolated = memory["interpolated"]  # XLA's estimates: affine in the shard
    assert interpolated["median_meets_goal"] is True and interpolated["max_error"] <= 0.05
    # the goal is 3% at every point: the 8-chip residual, fitted on 2 and 4 chips, misses it
    # by about a point at 2,048 tokens (4.1% on 2026-12-06), and that point is flagged
    assert interpolated["within_goal"] >= interpolated["trials"] - 1
    flagged = [line for line in out.splitlines() if line.endswith("OVER GOAL")]
    assert len(flagged) == sum(s["trials"] - s["within_goal"] for s in memory.values()
                               if s["basis"] != "all")

    assert gdn_sweep(["plan", "--db", planner_db, "--validate",
                      str(sweeps[MEASURED["name"]])]) == 0
    out = capsys.readouterr().out
    assert "step_time_s" in out and "summary" in out


def _sweeps(url: str):
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            return list(session.scalars(select(Sweep)))
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_plan_command_prints_the_three_picks(planner_db, capsys):
    assert gdn_sweep(["plan", "--db", planner_db, "--preset", "tiny", "--seq-len", "1024",
                      "--accelerator", "cpu", "--dtype", "float32", "--max-chips", "8",
                      "--mode", "p2p", "--param-sharding", "replicated", "--remat", "none"]
                     ) == 0
    out = capsys.readouterr().out
    for line in ("fewest chips that fit: gdn_only 1 chip (no CP)", "fewest chip-hours per token:",
                 "fastest within 8 chips:"):
        assert line in out
    assert gdn_sweep(["plan", "--db", planner_db, "--preset", "nope", "--seq-len", "1024",
                      "--accelerator", "cpu"]) == 2
    assert "preset='nope' is not one of" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_capacity_api_answers_and_names_bad_input(planner_db, backend):
    with _backend(planner_db, backend) as url, \
            TestClient(create_app(api_settings(url))) as client:
        ok = client.get("/api/capacity", params={
            "preset": "tiny", "num_layers": 1, "seq_len": 1024, "accelerator": "cpu",
            "dtype": "float32", "max_chips": 8})
        assert ok.status_code == 200
        body = ok.json()
        assert body["evidence_trials"] == 21 and body["fewest_chips"]["chips"] == 1
        # plans of p2p at 2-8 chips: their estimates; other modes: the analytic prediction;
        # dp > 1 meshes (no trial of any): their replica's figure moved by what dp changes
        bases = {dp: {c["memory_bytes_per_chip"]["basis"] for c in body["candidates"]
                      if (c["dp"] > 1) == dp} for dp in (False, True)}
        assert bases[False] == {"estimated", "predicted"}
        assert bases[True] <= {"extrapolated", "predicted"}
        assert "measured" in {c["step_time_s"]["basis"] for c in body["candidates"]}
        for params, named in (({"preset": "qwen9"}, "qwen9"), ({"accelerator": "h900"}, "h900"),
                              ({"seq_len": "0"}, "seq_len"), ({"mode": "ring"}, "ring"),
                              ({"guess": "1"}, "guess")):
            bad = client.get("/api/capacity", params={"preset": "tiny", "seq_len": 1024,
                                                      "accelerator": "cpu", **params})
            assert bad.status_code == 422 and named in bad.text, (params, bad.text)


@contextmanager
def _backend(sqlite_url: str, backend: str) -> Iterator[str]:
    """The fixture database as it is (SQLite), or copied into a scratch PostgreSQL one."""
    if backend == "sqlite":
        yield sqlite_url
        return
    with scratch_postgres_database("planner") as url:
        _copy_database(sqlite_url, url)
        yield url


def _copy_database(source: str, target: str) -> None:
    from service.db.models import Base

    upgrade_database(target)
    src, dst = make_engine(source), make_engine(target)
    try:
        with src.connect() as read, dst.begin() as write:
            for table in Base.metadata.sorted_tables:
                if table.name in ("cache_versions",):
                    continue
                rows = [dict(r._mapping) for r in read.execute(table.select())]
                if rows:
                    write.execute(table.insert(), rows)
    finally:
        src.dispose()
        dst.dispose()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_plan_fit_bisects_compiles_for_the_longest_sequence_that_fits(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'fit.db'}"
    base = ["plan", "--fit", "--preset", "tiny", "--num-layers", "1", "--seq-len", "512",
            "--accelerator", "cpu", "--dtype", "float32", "--chips", "2", "--mode", "p2p",
            "--db", url]
    assert gdn_sweep([*base, "--chip-memory-gib", "1000"]) == 0
    *_, row, recorded = capsys.readouterr().out.strip().splitlines()
    row = row.split()
    assert row[:5] == ["p2p", "2", "1", "replicated", "none"] and row[5] == "512"
    assert row[7] == "-" and f"recorded {row[-1]} compile(s) as plan trials" in recorded
    assert gdn_sweep([*base, "--chip-memory-gib", "0.000001"]) == 0
    *_, row, _ = capsys.readouterr().out.strip().splitlines()
    row = row.split()
    assert row[5] == "none" and row[7] == "32"  # not even one chunk per chip fits
    assert gdn_sweep([*base[:-6], "--chips", "2"]) == 2  # cpu needs a memory size
    assert "--chip-memory-gib" in capsys.readouterr().err
    # every compile is a plan trial: a plan at 512 tokens on 2 chips rests on its estimate
    plans = [r for r in _rows(url) if r.kind == "plan"]
    assert {r.seq_len for r in plans} >= {32, 512} and {r.status for r in plans} == {"succeeded"}
    answer = _answer(url, seq_len=512, max_chips=2)
    assert _candidate(answer, 2).memory_bytes_per_chip.basis == "estimated"


@pytest.mark.timeout(60)
def test_capacity_of_a_gdn_shape_given_by_hand(tmp_path):
    shape = {"hidden_size": 4096, "num_k_heads": 16, "num_v_heads": 32, "head_k_dim": 128,
             "head_v_dim": 128, "num_layers": 32, "intermediate_size": 12288,
             "vocab_size": 248_320}
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade_database(url)
    with TestClient(create_app(api_settings(url))) as client:
        answer = client.get("/api/capacity", params={**shape, "seq_len": 2 ** 20,
                                                     "accelerator": "h100"}).json()
        preset = client.get("/api/capacity", params={"preset": "qwen3.5-9b", "seq_len": 2 ** 20,
                                                     "accelerator": "h100",
                                                     "layers": "gdn_only"}).json()
        missing = client.get("/api/capacity", params={"hidden_size": 4096, "seq_len": 1024,
                                                      "accelerator": "h100"})
        bad = client.get("/api/capacity", params={"preset": "qwen3.5-9b", "num_v_heads": 33,
                                                  "seq_len": 1024, "accelerator": "h100"})
    # qwen3.5-9b's shape by hand (GDN only: no attention geometry): the same predictions as
    # the preset's GDN-only decoder, said to rest on no trial
    assert answer["evidence_trials"] == 0 and "by hand" in answer["model_note"]
    assert [c["memory_bytes_per_chip"]["value"] for c in answer["candidates"]] == [
        c["memory_bytes_per_chip"]["value"] for c in preset["candidates"]]
    assert {c["memory_bytes_per_chip"]["basis"] for c in answer["candidates"]} == {"predicted"}
    assert missing.status_code == 422 and "num_k_heads" in missing.text and "vocab_size" in missing.text
    assert bad.status_code == 422 and "num_v_heads=33" in bad.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("accelerator, platform", [("h100", "gpu"), ("v5p", "tpu")])
def test_fused_jax_gdn_is_the_pallas_rule_unmeasured_until_a_trial_is(tmp_path, accelerator,
                                                                       platform):
    """With no trial of it, every fused JAX candidate names the Pallas rule for the chip's
    platform and marks its step time unmeasured; the reference's never are."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade_database(url)
    query = {"preset": "qwen3.5-0.8b", "seq_len": 32768, "accelerator": accelerator,
             "max_chips": 8, "layers": "gdn_only", "modes": "p2p", "remats": "full"}
    with TestClient(create_app(api_settings(url))) as client:
        answers = {k: client.get("/api/capacity", params={**query, "kernels": k}).json()
                   for k in ("reference", "fused")}
    fused, reference = answers["fused"]["candidates"], answers["reference"]["candidates"]
    assert fused and reference
    for c in fused:
        assert c["gdn_kernel"] == f"gdn_core pallas chunk rule ({platform})"
        assert c["gdn_kernel_unmeasured"] and not c["step_time_s"]["trial_ids"]
        assert c["step_time_s"]["note"].startswith("unmeasured: no measured (non-interpreted) "
                                                   "trial of the Pallas chunk rule")
    assert not any(c["gdn_kernel_unmeasured"] for c in reference)
    assert not any("unmeasured" in c["step_time_s"]["note"] for c in reference)


@pytest.mark.timeout(60)
def test_capacity_plans_per_kernels_and_names_jax_fused_gdn(session_factory, db_url):
    """Reference and fused trials are never fitted together; every candidate names what its
    GDN layers run: JAX's fused GDN is the Pallas chunk rule."""
    from .seed import seed_sweep

    seed_sweep(session_factory, name="k", frameworks=["jax"], modes=["p2p"], chips=[1, 2],
               seq_lens=[256, 512], kernels=["reference", "fused"],
               speed_of=lambda t: 2.0 if t.kernels == "fused" else 1.0)
    query = {"preset": "tiny", "seq_len": 512, "accelerator": "cpu", "num_layers": 1,
             "dtype": "float32", "max_chips": 2, "modes": "p2p", "param_shardings": "replicated",
             "remats": "none"}
    with TestClient(create_app(api_settings(db_url))) as client:
        answers = {k: client.get("/api/capacity", params={**query, "kernels": k}).json()
                   for k in ("reference", "fused")}
        bad = client.get("/api/capacity", params={**query, "kernels": "turbo"})
    assert bad.status_code == 422 and "kernels" in bad.text
    with session_factory() as session:
        ids = {k: {r.trial_id for r in session.scalars(select(Result).where(
            Result.kernels == k, Result.status == "succeeded"))} for k in ("reference", "fused")}
    for kernels, answer in answers.items():
        (two,) = [c for c in answer["candidates"] if c["chips"] == 2 and c["dp"] == 1]
        assert two["kernels"] == kernels and two["step_time_s"]["basis"] == "measured"
        assert set(two["step_time_s"]["trial_ids"]) <= ids[kernels]
        assert not two["gdn_kernel_unmeasured"]  # a fused trial measured it (seeded)
        assert "unmeasured" not in two["step_time_s"]["note"]
    assert answers["reference"]["candidates"][0]["gdn_kernel"] == "reference jax chunk rule"
    # JAX's fused GDN is the Pallas chunk rule; on CPU chips it runs only interpreted.
    assert answers["fused"]["candidates"][0]["gdn_kernel"] == (
        "gdn_core pallas chunk rule (interpreted), only under GDN_SWEEP_INTERPRET_KERNELS=1")
    assert any("JAX's fused GDN layers run this project's Pallas chunk rule" in c
               for c in answers["fused"]["caveats"])
    assert not any("Pallas" in c for c in answers["reference"]["caveats"])


@pytest.mark.timeout(60)
def test_capacity_answers_with_dp_x_cp_meshes(session_factory, db_url):
    """Every mesh of each chip count is a candidate: a dp > 1 mesh with a trial of exactly it
    is measured (from that trial alone); one without is its replica's figures (fitted to
    dp 1 trials only) moved by what dp changes, labelled extrapolated and saying so; the
    Pareto front keeps no candidate another beats on chips, tokens/s and memory."""
    from gdn_core.memory.step import predict_step_memory
    from gdn_core.presets import get_preset
    from gdn_core.train_config import TrainConfig

    from .seed import seed_sweep

    seed_sweep(session_factory, name="dp", frameworks=["jax"], modes=["p2p"], chips=[1, 2, 4],
               dp=[1, 2], seq_lens=[256, 512], param_shardings=["replicated", "zero1"],
               speed_of=lambda t: 50.0 if t.dp > 1 else 1.0)
    query = {"preset": "tiny", "seq_len": 512, "accelerator": "cpu", "num_layers": 1,
             "dtype": "float32", "max_chips": 4, "modes": "p2p",
             "param_shardings": ["replicated", "zero1"], "remats": "none"}
    with TestClient(create_app(api_settings(db_url))) as client:
        answer = client.get("/api/capacity", params=query).json()
        only_dp1 = client.get("/api/capacity", params={**query, "dp": 1}).json()
        bad = client.get("/api/capacity", params={**query, "dp": 0})
    assert bad.status_code == 422 and "dp" in bad.text
    with session_factory() as session:
        meshes = set(session.scalars(select(Result.trial_id).where(Result.dp > 1)))
        single = set(session.scalars(select(Result.trial_id).where(Result.dp == 1)))
    by_mesh = {(c["chips"], c["dp"], c["param_sharding"]): c for c in answer["candidates"]}
    assert {(chips, dp) for chips, dp, _ in by_mesh} == {(1, 1), (2, 1), (2, 2), (4, 1),
                                                        (4, 2), (4, 4)}
    assert {c["dp"] for c in only_dp1["candidates"]} == {1}

    measured = by_mesh[4, 2, "replicated"]  # a trial of exactly dp 2 × cp 2 at 512 tokens
    assert (measured["cp_chips"], measured["local_tokens"]) == (2, 512 // 2)
    assert measured["step_time_s"]["basis"] == "measured"
    assert set(measured["step_time_s"]["trial_ids"]) <= meshes
    assert measured["global_batch_size"] == 2
    assert measured["tokens_per_s"]["value"] == pytest.approx(
        2 * 512 / measured["step_time_s"]["value"])

    derived = by_mesh[4, 4, "zero1"]  # pure data parallel: no trial of it
    replica = by_mesh[1, 1, "replicated"]  # one chip: param_sharding is moot there
    assert (derived["mode"], derived["cp_chips"]) == ("none", 1)
    for figure in ("memory_bytes_per_chip", "step_time_s"):
        assert derived[figure]["basis"] == "extrapolated", derived[figure]
        assert "dp=4" in derived[figure]["note"] and "replica" in derived[figure]["note"]
        assert set(derived[figure]["trial_ids"]) <= single
    model, train = get_preset("tiny", num_layers=1), TrainConfig(seq_len=512,
                                                                 param_sharding="zero1")
    change = (predict_step_memory(model, train, mode="p2p", chips=1, dp=4, framework="jax").total
              - predict_step_memory(model, train, mode="p2p", chips=1, framework="jax").total)
    assert change < 0  # zero1 over 4 chips: a quarter of the AdamW state
    assert derived["memory_bytes_per_chip"]["value"] == pytest.approx(
        replica["memory_bytes_per_chip"]["value"] + change)
    assert derived["step_time_s"]["value"] > replica["step_time_s"]["value"]  # + weight sync

    assert_pareto_front(answer["pareto"], answer["candidates"])


def assert_pareto_front(front: list, candidates: list) -> None:
    """No fitting candidate beats a member of the front on chips, tokens/s and memory, and
    every one off it is beaten by a member (dicts of the API's JSON, or Candidates)."""
    rows = [c if isinstance(c, dict) else c.model_dump() for c in candidates]
    front = [c if isinstance(c, dict) else c.model_dump() for c in front]

    def key(c):
        return (c["chips"], -c["tokens_per_s"]["value"], c["memory_bytes_per_chip"]["value"])

    def beats(a, b):
        return all(x <= y for x, y in zip(key(a), key(b))) and key(a) != key(b)

    timed = [c for c in rows if c["fits"] and c["tokens_per_s"]["value"]]
    assert front and not any(beats(c, p) for p in front for c in timed)
    assert all(any(beats(p, c) for p in front) for c in timed if c not in front)


@pytest.mark.timeout(60)
def test_the_planner_rests_on_single_document_trials_only(session_factory):
    """Packed trials skip the attention between documents: another workload than the planner's
    requests (one document per sequence) name, so they are no evidence for it."""
    from .seed import seed_sweep

    seed_sweep(session_factory, name="packed", frameworks=["jax"], modes=["p2p"], chips=[1, 2],
               seq_lens=[256], documents=["single", "uniform:16-64"])
    with session_factory() as session:
        packed = set(session.scalars(select(Result.trial_id).where(
            Result.documents == "uniform:16-64")))
        observations = load_observations(session, preset="tiny", accelerator_type="cpu")
    assert len(packed) == 2 and len(observations) == 2
    assert not packed & {o.trial_id for o in observations}
