"""Profiles through the API, on SQLite and PostgreSQL: `profile: true` on a sweep, a profiled
trial's trace served for download (the Chrome trace torch.profiler wrote, byte for byte), its
summary on the trial, the 404s that say why there is none, and POST /api/trials/{id}/profile
queueing a one-trial sweep of exactly that point."""

from __future__ import annotations

import gzip
import json

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from service.db import crud
from service.db.models import Result
from workers.profile_store import artifact_path

from .conftest import TINY_SWEEP, api_settings
from .profile_seed import seed_profiled_sweep


@pytest.fixture
def artifacts(tmp_path):
    return tmp_path / "artifacts"


@pytest.fixture
def profiled(session_factory, artifacts):
    return seed_profiled_sweep(session_factory, artifacts)


@pytest.fixture
def profile_client(db_url, artifacts):
    with TestClient(create_app(api_settings(db_url, artifact_dir=str(artifacts)))) as client:
        yield client


@pytest.mark.timeout(60)
def test_a_profiled_trial_serves_its_trace_and_summary(profile_client, profiled,
                                                       session_factory, artifacts):
    trial = profile_client.get(f"/api/trials/{profiled['profiled']}").json()
    profile = trial["profile"]
    assert profile["url"] == f"/api/trials/{profiled['profiled']}/profile"
    assert profile["format"] == "chrome_trace_json_gz" and profile["error"] is None
    summary = profile["summary"]
    assert "aten::mm" in {op["name"] for op in summary["top_ops"]}
    assert summary["busy_s"] <= summary["wall_s"]

    response = profile_client.get(profile["url"])
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    filename = f"trial-{profiled['profiled']}.pt.trace.json.gz"
    assert f'filename="{filename}"' in response.headers["content-disposition"]
    with session_factory() as session:
        stored = artifact_path(str(artifacts), session.get(Result, profiled["profiled"])
                               .profile_path)
    assert response.content == stored.read_bytes() and len(response.content) == profile["bytes"]
    trace = json.loads(gzip.decompress(response.content))
    assert "aten::mm" in {e.get("name") for e in trace["traceEvents"]}

    listed = profile_client.get(f"/api/sweeps/{profiled['sweep']}/trials").json()["data"]
    assert {t["id"]: t["profile"] is not None for t in listed} == {
        profiled["profiled"]: True, profiled["plain"]: False}
    csv = profile_client.get("/api/results?format=csv").text
    assert "profile" in csv.splitlines()[0].split(",")


@pytest.mark.timeout(60)
def test_no_trace_is_a_404_that_says_why(profile_client, profiled, session_factory,
                                         artifacts):
    plain = profile_client.get(f"/api/trials/{profiled['plain']}/profile")
    assert plain.status_code == 404
    assert "ran without profile: true" in plain.json()["detail"]
    assert f"POST /api/trials/{profiled['plain']}/profile" in plain.json()["detail"]
    missing = profile_client.get("/api/trials/999999/profile")
    assert missing.status_code == 404 and "trial 999999 not found" in missing.json()["detail"]
    assert profile_client.get("/api/trials/0/profile").status_code == 422

    with session_factory() as session:  # the file went missing from the artifact directory
        artifact_path(str(artifacts), session.get(Result, profiled["profiled"]).profile_path
                      ).unlink()
    gone = profile_client.get(f"/api/trials/{profiled['profiled']}/profile")
    assert gone.status_code == 404 and "GDN_SWEEP_ARTIFACT_DIR" in gone.json()["detail"]

    with session_factory() as session:  # a profiler that failed: its error is the answer
        row = session.get(Result, profiled["profiled"])
        row.profile_path, row.profile_error = None, "the profiler failed to start: busy"
        session.commit()
    failed = profile_client.get(f"/api/trials/{profiled['profiled']}/profile")
    assert failed.status_code == 404 and "failed to start: busy" in failed.json()["detail"]


@pytest.mark.timeout(60)
def test_profiling_a_trial_queues_a_sweep_of_its_point(profile_client, profiled,
                                                       session_factory):
    for kind in ("profiled", "plain"):  # chips=2 all_gather, and the one-chip baseline
        original = profile_client.get(f"/api/trials/{profiled[kind]}").json()
        created = profile_client.post(f"/api/trials/{profiled[kind]}/profile")
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["status"], body["trials"], body["skipped"]) == ("queued", 1, 0)
        sweep = profile_client.get(f"/api/sweeps/{body['id']}").json()
        assert sweep["spec"]["profile"] is True
        (trial,) = profile_client.get(f"/api/sweeps/{body['id']}/trials").json()["data"]
        assert trial["key"] == original["key"]  # the same point: its key means what it did
        for field in ("framework", "mode", "chips", "dp", "seq_len", "batch_size", "preset",
                      "num_layers", "dtype", "steps", "warmup_steps", "accelerator"):
            assert trial[field] == original[field], field
        with session_factory() as session:  # the runner hands the trial over profiled
            (spec,) = crud.sweep_trials(session=session, sweep_id=body["id"])
        assert spec.profile and spec.key == original["key"]
    assert profile_client.post("/api/trials/999999/profile").status_code == 404


@pytest.mark.timeout(60)
def test_plans_cannot_be_profiled_and_profile_must_be_a_boolean(profile_client):
    plan = profile_client.post("/api/sweeps", json={
        **TINY_SWEEP, "name": "plans", "frameworks": ["jax"], "kinds": ["plan"]}).json()
    (trial,) = profile_client.get(f"/api/sweeps/{plan['id']}/trials").json()["data"]
    refused = profile_client.post(f"/api/trials/{trial['id']}/profile")
    assert refused.status_code == 409
    assert "kind='plan'" in refused.json()["detail"]
    bad = profile_client.post("/api/sweeps", json={**TINY_SWEEP, "profile": "yes"})
    assert bad.status_code == 422
    (item,) = bad.json()["detail"]
    assert item["loc"] == ["body", "profile"] and "boolean" in item["msg"]
    sweeps = profile_client.get("/api/sweeps").json()["count"]
    assert sweeps == 1  # nothing half-written


@pytest.mark.timeout(240)  # a real sweep: the scheduler, Ray workers, the profiler (~9 s)
def test_a_profiled_sweep_runs_end_to_end_through_the_scheduler(local_ray, tmp_path):
    """POST a profile: true sweep to a service with its scheduler: the torch trial's trace
    lands under the service's artifact directory and downloads as torch.profiler wrote it."""
    import time

    import httpx

    from service.core.config import Settings

    from .conftest import serving

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'e2e.db'}", scheduler_poll_s=0.2,
                        cpu_chips=4, artifact_dir=str(tmp_path / "artifacts"))
    with serving(settings) as base:
        created = httpx.post(f"{base}/api/sweeps", json={
            **TINY_SWEEP, "chips": [2], "one_chip_baseline": False, "profile": True})
        assert created.status_code == 201, created.text
        sweep_id, deadline = created.json()["id"], time.monotonic() + 200
        while httpx.get(f"{base}/api/sweeps/{sweep_id}").json()["status"] != "finished":
            assert time.monotonic() < deadline, "the sweep did not finish"
            time.sleep(0.5)
        (trial,) = httpx.get(f"{base}/api/sweeps/{sweep_id}/trials").json()["data"]
        assert trial["status"] == "succeeded", trial["error"]
        assert trial["measured_steps"] == TINY_SWEEP["steps"]
        profile = trial["profile"]
        assert profile["error"] is None and profile["summary"]["collective_s"] > 0
        download = httpx.get(base + profile["url"])
    assert download.status_code == 200 and len(download.content) == profile["bytes"]
    names = {e.get("name") for e in json.loads(gzip.decompress(download.content))["traceEvents"]}
    assert {"aten::mm", "_AllGather"} <= names
    assert list((tmp_path / "artifacts" / "profiles").glob("*/*.pt.trace.json.gz"))
