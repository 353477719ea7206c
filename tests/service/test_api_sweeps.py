"""POST/GET /api/sweeps, trials, cancel and auth, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.db.models import Result, Sweep, Trial
from service.main import create_app
from service.runs import sweep_run

from .conftest import TINY_SWEEP, api_settings


def sweep_body(**changes) -> dict:
    return {**TINY_SWEEP, **changes}


def row_counts(session_factory) -> tuple[int, int, int]:
    with session_factory() as s:
        return tuple(s.scalar(select(func.count()).select_from(m)) for m in (Sweep, Trial, Result))


def test_create_counts_trials_and_skipped_points(client, session_factory):
    body = sweep_body(frameworks=["jax", "torch"], modes=["ulysses", "p2p"], chips=[1, 2, 8],
                      seq_lens=[64, 128])
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 201, r.text
    created = r.json()
    # Per framework and seq_len: one one-chip baseline + 2 modes × chips 2, 8. tiny has 4 value
    # heads: ulysses cannot split them over 8 chips (2 frameworks × 2 seq_lens).
    assert created == {"id": created["id"], "name": "tiny", "status": "queued", "trials": 20,
                       "skipped": 4}
    sweep = client.get(f"/api/sweeps/{created['id']}").json()
    assert sweep["counts"]["pending"] == 16 and sweep["counts"]["skipped"] == 4
    assert sweep["trials_done"] == 4 and sweep["spec"]["chips"] == [1, 2, 8]
    skipped = client.get(f"/api/sweeps/{created['id']}/trials", params={"status": "skipped"})
    assert skipped.json()["count"] == 4
    trial = skipped.json()["data"][0]
    assert trial["mode"] == "ulysses" and trial["chips"] == 8
    assert "value heads (4) divisible by chips=8" in trial["error"]
    assert row_counts(session_factory) == (1, 20, 4)  # skipped points carry their result row


@pytest.mark.parametrize("change, loc, needle", [
    ({"modes": ["ring"]}, ["body", "modes", 0], "'ulysses', 'p2p', 'all_gather' or 'log_scan'"),
    ({"frameworks": ["tf"]}, ["body", "frameworks", 0], "'jax' or 'torch'"),
    ({"model": {"preset": "gpt5"}}, ["body", "model", "preset"], "qwen3.5-27b"),
    ({"chips": [0, 2]}, ["body", "chips"], "use integers >= 1"),
    ({"dtypes": ["fp8"]}, ["body", "dtypes", 0], "'float32' or 'bfloat16'"),
    ({"dtype": "fp8"}, ["body", "dtype", 0], "'float32' or 'bfloat16'"),
    ({"param_shardings": ["zero3"]}, ["body", "param_shardings", 0],
     "'replicated', 'zero1' or 'fsdp'"),
    ({"remats": ["some"]}, ["body", "remats", 0], "'none', 'full' or 'gdn'"),
    ({"remats": []}, ["body", "remats"], "at least 1 item"),
    ({"repeats": 0}, ["body", "repeats"], "greater than or equal to 1"),
    ({"repeats": 21}, ["body", "repeats"], "less than or equal to 20"),
    ({"modes": ["none"]}, ["body", "modes", 0], "'ulysses', 'p2p', 'all_gather' or 'log_scan'"),
    ({"accelerator": {"kind": "gpu", "type": "k80"}}, ["body", "accelerator"], "h100"),
    ({"colour": "red"}, ["body", "colour"], "Extra inputs are not permitted"),
], ids=["mode", "framework", "preset", "chips", "dtypes", "dtype-singular", "param_shardings",
        "remats", "remats-empty", "repeats-0", "repeats-21", "mode-none", "accelerator",
        "unknown-field"])
def test_invalid_input_is_422_naming_field_and_accepted_values(client, session_factory, change,
                                                               loc, needle):
    r = client.post("/api/sweeps", json=sweep_body(**change))
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert any(e["loc"] == loc and needle in e["msg"] for e in errors), errors
    assert row_counts(session_factory) == (0, 0, 0)


def test_step_settings_are_grid_dimensions_with_distinct_keys(client, session_factory):
    # Two values of each new dimension: 8 trials, none colliding on (sweep_id, key).
    body = sweep_body(seq_lens=[64], dtypes=["float32", "bfloat16"],
                      param_shardings=["replicated", "fsdp"], remats=["none", "full"])
    created = client.post("/api/sweeps", json=body).json()
    assert created["trials"] == 8
    trials = client.get(f"/api/sweeps/{created['id']}/trials").json()["data"]
    points = {(t["dtype"], t["param_sharding"], t["remat"]) for t in trials}
    assert len(points) == 8 and len({t["key"] for t in trials}) == 8
    assert all(f"/param_sharding={t['param_sharding']}/remat={t['remat']}" in t["key"]
               for t in trials)
    spec = client.get(f"/api/sweeps/{created['id']}").json()["spec"]
    assert spec["param_shardings"] == ["replicated", "fsdp"] and spec["remats"] == ["none", "full"]
    options = client.get("/api/options").json()
    assert options["param_shardings"] == ["replicated", "zero1", "fsdp"]
    assert options["remats"] == ["none", "full", "gdn"]


def test_one_chip_runs_once_as_the_baseline_every_mode_refers_to(client):
    body = sweep_body(modes=["ulysses", "p2p", "all_gather"], chips=[1, 2, 4],
                      seq_lens=[64, 128], remats=["none", "full"])
    created = client.post("/api/sweeps", json=body).json()
    # per seq_len and remat: one baseline + 3 modes × 2 chip counts
    assert created["trials"] == 2 * 2 * (1 + 3 * 2) == 28
    trials = client.get(f"/api/sweeps/{created['id']}/trials").json()["data"]
    baselines = {t["key"]: t for t in trials if t["chips"] == 1}
    assert len(baselines) == 4 and {t["mode"] for t in baselines.values()} == {"none"}
    assert all(t["verify"] is False and t["baseline_key"] is None for t in baselines.values())
    for t in trials:
        if t["chips"] == 1:
            continue
        baseline = baselines[t["baseline_key"]]  # the same work on one chip
        assert (baseline["seq_len"], baseline["remat"], baseline["repeat"]) == \
            (t["seq_len"], t["remat"], t["repeat"])
        assert t["baseline_trial_id"] == baseline["id"]
    assert {t["mode"] for t in trials if t["chips"] > 1} == {"ulysses", "p2p", "all_gather"}
    assert "none" in client.get("/api/options").json()["trial_modes"]


def test_no_one_in_chips_means_no_baseline(client):
    created = client.post("/api/sweeps", json=sweep_body(modes=["p2p", "all_gather"],
                                                          chips=[2, 4])).json()
    assert created["trials"] == 4
    trials = client.get(f"/api/sweeps/{created['id']}/trials").json()["data"]
    assert {t["baseline_key"] for t in trials} == {None}


def test_repeats_expand_into_keyed_trials(client):
    created = client.post("/api/sweeps", json=sweep_body(modes=["p2p"], chips=[1, 2],
                                                          repeats=3)).json()
    assert created["trials"] == 3 * 2
    trials = client.get(f"/api/sweeps/{created['id']}/trials").json()["data"]
    # repeats are the outer loop: every point once, then again
    assert [(t["repeat"], t["mode"]) for t in trials] == [
        (r, mode) for r in range(3) for mode in ("none", "p2p")]
    assert [t["key"].rsplit("/", 1)[1] for t in trials] == [
        f"repeat={r}" for r in range(3) for _ in range(2)]
    once = client.post("/api/sweeps", json=sweep_body(modes=["p2p"], chips=[1, 2])).json()
    keys = [t["key"] for t in client.get(f"/api/sweeps/{once['id']}/trials").json()["data"]]
    assert not any("repeat=" in k for k in keys)  # keys of unrepeated sweeps stay as they were
    spec = client.get(f"/api/sweeps/{created['id']}").json()["spec"]
    assert spec["repeats"] == 3 and spec["one_chip_baseline"] is True


def test_singular_dtype_of_older_sweep_files_still_reads(client):
    created = client.post("/api/sweeps", json=sweep_body(dtype="bfloat16")).json()
    spec = client.get(f"/api/sweeps/{created['id']}").json()["spec"]
    assert spec["dtypes"] == ["bfloat16"] and spec["param_shardings"] == ["replicated"]


def test_grid_over_the_cap_is_422_and_writes_nothing(client, session_factory):
    body = sweep_body(frameworks=["jax", "torch"], modes=["p2p", "all_gather"],
                      chips=[1, 2, 4, 8], seq_lens=[64, 128, 256])  # 2 × 3 × (1 + 2 × 3) = 42
    assert client.post("/api/sweeps", json=body).json()["trials"] == 42
    before = row_counts(session_factory)
    body["seq_lens"] = [64, 128, 256, 512, 1024]  # 2 × 5 × 7 = 70 > 64
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["type"] == "grid_too_large" and "70 trials" in error["msg"]
    assert "the one-chip baseline" in error["msg"]
    assert "GDN_SWEEP_GRID_CAP" in error["msg"] and error["ctx"]["grid_cap"] == 64
    assert row_counts(session_factory) == before
    # repeats multiply the grid: 42 × 2 = 84 > 64
    r = client.post("/api/sweeps", json={**body, "seq_lens": [64, 128, 256], "repeats": 2})
    assert r.status_code == 422 and "84 trials (measure: repeats 2" in r.json()["detail"][0]["msg"]
    assert row_counts(session_factory) == before


def test_list_is_paged_newest_first_with_counts(client):
    ids = [client.post("/api/sweeps", json=sweep_body(name=f"s{i}")).json()["id"]
           for i in range(5)]
    page = client.get("/api/sweeps", params={"limit": 2}).json()
    assert page["count"] == 5
    assert [s["id"] for s in page["data"]] == ids[::-1][:2]
    page = client.get("/api/sweeps", params={"limit": 2, "offset": 4}).json()
    assert [s["name"] for s in page["data"]] == ["s0"]
    assert page["data"][0]["counts"] == {"pending": 1, "running": 0, "succeeded": 0, "failed": 0,
                                         "oom": 0, "timeout": 0, "skipped": 0, "cancelled": 0}
    assert client.get("/api/sweeps", params={"limit": 0}).status_code == 422


def test_queued_sweeps_carry_their_place_in_the_scheduler_queue(client, session_factory):
    ids = [client.post("/api/sweeps", json=sweep_body(name=f"q{i}")).json()["id"]
           for i in range(4)]
    assert [client.get(f"/api/sweeps/{i}").json()["queue_position"] for i in ids] == [1, 2, 3, 4]
    client.post(f"/api/sweeps/{ids[1]}/cancel")
    with session_factory() as session:  # another host's live runner takes the oldest
        assert sweep_run.claim(session=session, sweep_id=ids[0], runner_id="svc@elsewhere:1:1",
                               lease_s=60) == "running"
        scheduler_next = sweep_run.next_sweep_id(session=session, lease_s=60)
    listed = {s["id"]: s["queue_position"] for s in client.get("/api/sweeps").json()["data"]}
    assert listed == {ids[0]: None, ids[1]: None, ids[2]: 1, ids[3]: 2}
    assert client.get(f"/api/sweeps/{ids[3]}").json()["queue_position"] == 2
    assert scheduler_next == ids[2]  # position 1 is the one the scheduler takes next


def test_trials_and_trial_carry_the_documented_fields(client):
    sid = client.post("/api/sweeps", json=sweep_body(seq_lens=[64, 128])).json()["id"]
    trials = client.get(f"/api/sweeps/{sid}/trials").json()
    assert trials["count"] == 2
    one = client.get(f"/api/trials/{trials['data'][1]['id']}").json()
    assert one.pop("environment") is None  # the detail adds it; none before the trial runs
    assert one == trials["data"][1]
    for field in ("id", "sweep_id", "framework", "mode", "chips", "seq_len", "batch_size",
                  "preset", "num_layers", "dtype", "accelerator", "status", "error",
                  "step_time_s", "tokens_per_s_per_chip", "model_flops_per_step", "mfu", "hfu",
                  "peak_memory_bytes_per_chip", "memory_source", "comm_bytes_per_step_per_chip",
                  "loss_first", "loss_last", "max_rel_err", "created_at", "started_at",
                  "finished_at", "versions", "environment_id"):
        assert field in one, field
    assert one["num_layers"] == 1 and one["seq_len"] == 128 and one["status"] == "pending"
    assert one["created_at"].endswith(("Z", "+00:00"))


def test_missing_things_are_404(client):
    assert client.get("/api/sweeps/999").status_code == 404
    assert client.get("/api/sweeps/999/trials").json()["detail"] == "sweep 999 not found"
    assert client.get("/api/trials/999").status_code == 404
    assert client.post("/api/sweeps/999/cancel").status_code == 404


def test_cancel_a_queued_sweep_closes_every_trial_once(client, session_factory):
    sid = client.post("/api/sweeps", json=sweep_body(seq_lens=[64, 128, 192])).json()["id"]
    r = client.post(f"/api/sweeps/{sid}/cancel")
    assert r.status_code == 202
    assert r.json()["status"] == "cancelled" and r.json()["counts"]["cancelled"] == 3
    assert row_counts(session_factory) == (1, 3, 3)
    again = client.post(f"/api/sweeps/{sid}/cancel")
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_mutating_calls_need_the_bearer_token_when_one_is_set(db_url, session_factory):
    with TestClient(create_app(api_settings(db_url, api_token="s3cret"))) as client:
        assert client.post("/api/sweeps", json=sweep_body()).status_code == 401
        bad = client.post("/api/sweeps", json=sweep_body(),
                          headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
        assert row_counts(session_factory) == (0, 0, 0)
        good = client.post("/api/sweeps", json=sweep_body(),
                           headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 201
        sid = good.json()["id"]
        assert client.post(f"/api/sweeps/{sid}/cancel").status_code == 401
        assert client.get(f"/api/sweeps/{sid}").status_code == 200  # reads stay open
        assert client.get("/api/options").json()["auth_required"] is True
        assert client.post(f"/api/sweeps/{sid}/cancel",
                           headers={"Authorization": "Bearer s3cret"}).status_code == 202


def test_health_reports_the_database(client):
    r = client.get("/api/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["database"]["ok"] is True
    assert r.json()["ray"]["ok"] is None  # no scheduler in this app


def test_stored_sweep_that_a_newer_rule_refuses_still_reads(client, session_factory):
    # torch on TPU was accepted before it was refused: such a sweep must stay readable (200),
    # while a new one is a 422 naming the rule.
    r = client.post("/api/sweeps", json=sweep_body(accelerator={"kind": "tpu", "type": "v5p"},
                                                   frameworks=["jax"]))
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    with session_factory() as s:
        sweep = s.get(Sweep, sweep_id)
        sweep.spec = {**sweep.spec, "frameworks": ["torch"]}
        s.commit()
    got = client.get(f"/api/sweeps/{sweep_id}")
    assert got.status_code == 200, got.text
    assert got.json()["spec"]["frameworks"] == ["torch"]
    refused = client.post("/api/sweeps", json=sweep_body(
        accelerator={"kind": "tpu", "type": "v5p"}, frameworks=["torch"]))
    assert refused.status_code == 422 and "tpu" in refused.text
