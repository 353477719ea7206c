"""/api/schedules (create, list, read, change, pause, resume, delete; 422s that name the bad
value; the perimeter of every write) and `gdn-sweep schedule`, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.cli.main import main as cli_main
from service.db.engine import make_engine, make_session_factory
from service.db.models import Schedule, Sweep
from service.main import create_app
from service.runs.schedule_firing import fire_due

from .conftest import api_settings
from .test_schedules import SKIPPED_ONLY

SCHEDULE_KEYS = {"id", "name", "cron", "timezone", "spec", "paused", "allow_overlap",
                 "next_run_at", "last_run_at", "created_at", "updated_at", "runs"}


@pytest.fixture
def api(db_url):
    with TestClient(create_app(api_settings(db_url))) as test_client:
        yield test_client


def body(**fields) -> dict:
    return {"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin",
            "spec": SKIPPED_ONLY, **fields}


def parse(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def schedule_count(url: str) -> int:
    engine = make_engine(url)
    with make_session_factory(engine)() as session:
        n = session.scalar(select(func.count()).select_from(Schedule))
    engine.dispose()
    return n


def test_create_read_list_and_the_next_run_in_the_zone(api):
    before = dt.datetime.now(dt.UTC)
    created = api.post("/api/schedules", json=body())
    assert created.status_code == 201, created.text
    schedule = created.json()
    assert SCHEDULE_KEYS <= set(schedule)
    assert (schedule["paused"], schedule["allow_overlap"], schedule["runs"],
            schedule["last_run_at"]) == (False, False, [], None)
    assert schedule["spec"]["name"] == "skip"
    next_run = parse(schedule["next_run_at"])  # 02:00 Berlin is 01:00 or 00:00 UTC
    assert schedule["next_run_at"].endswith("Z") and next_run.minute == 0
    assert next_run.hour in (0, 1) and before < next_run <= before + dt.timedelta(days=1)
    assert api.get(f"/api/schedules/{schedule['id']}").json() == schedule
    second = api.post("/api/schedules", json=body(name="second", paused=True)).json()
    assert second["next_run_at"] is None
    listed = api.get("/api/schedules").json()
    assert listed["count"] == 2
    assert [s["id"] for s in listed["data"]] == [second["id"], schedule["id"]]
    page = api.get("/api/schedules", params={"offset": 1, "limit": 1}).json()
    assert [s["id"] for s in page["data"]] == [schedule["id"]] and page["count"] == 2
    assert api.get("/api/schedules/999999").status_code == 404


@pytest.mark.parametrize(("fields", "loc", "named"), [
    ({"cron": "0 2 * *"}, ["body", "cron"], "'0 2 * *'"),
    ({"cron": "0 0 31 2 *"}, ["body", "cron"], "never due"),
    ({"timezone": "Mars/Olympus"}, ["body", "timezone"], "'Mars/Olympus'"),
    ({"spec": {**SKIPPED_ONLY, "seq_lens": list(range(2, 200, 2))}}, ["body", "spec"],
     "GDN_SWEEP_GRID_CAP"),
    ({"spec": {**SKIPPED_ONLY, "model": {"preset": "nope"}}},
     ["body", "spec", "model", "preset"], "'nope'"),
    ({"name": " "}, ["body", "name"], "blank"),
], ids=["cron-fields", "cron-never", "timezone", "grid-cap", "preset", "name"])
def test_bad_input_is_a_422_naming_it_and_writes_nothing(api, db_url, fields, loc,
                                                         named):
    refused = api.post("/api/schedules", json=body(**fields))
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["detail"]
    assert error["loc"] == loc and named in error["msg"]
    if loc[1] == "cron":
        assert "five fields" in error["msg"]
    if loc[1] == "timezone":
        assert "IANA" in error["msg"]
    assert schedule_count(db_url) == 0


def test_patch_pause_resume_recompute_the_next_run_from_now(api):
    schedule = api.post("/api/schedules", json=body()).json()
    patched = api.patch(f"/api/schedules/{schedule['id']}",
                        json={"cron": "*/5 * * * *", "timezone": "UTC", "name": "every 5"})
    assert patched.status_code == 200, patched.text
    patched = patched.json()
    assert (patched["name"], patched["cron"], patched["timezone"]) == (
        "every 5", "*/5 * * * *", "UTC")
    next_run = parse(patched["next_run_at"])
    now = dt.datetime.now(dt.UTC)
    assert next_run.minute % 5 == 0 and now < next_run <= now + dt.timedelta(minutes=5)
    assert parse(patched["updated_at"]) > parse(schedule["updated_at"])
    refused = api.patch(f"/api/schedules/{schedule['id']}", json={"cron": "every day"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "cron"]
    refused = api.patch(f"/api/schedules/{schedule['id']}",
                        json={"spec": {**SKIPPED_ONLY, "model": {"preset": "nope"}}})
    assert refused.status_code == 422
    assert api.get(f"/api/schedules/{schedule['id']}").json()["cron"] == "*/5 * * * *"
    paused = api.post(f"/api/schedules/{schedule['id']}/pause").json()
    assert paused["paused"] is True and paused["next_run_at"] is None
    resumed = api.post(f"/api/schedules/{schedule['id']}/resume").json()
    assert resumed["paused"] is False
    assert dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5) < parse(resumed["next_run_at"])
    assert api.patch("/api/schedules/999999", json={"name": "x"}).status_code == 404
    assert api.post("/api/schedules/999999/pause").status_code == 404


def test_delete_keeps_the_sweeps_it_created_and_sweeps_filter_by_schedule(api, db_url):
    schedule = api.post("/api/schedules", json=body(cron="* * * * *", timezone="UTC",
                                                    allow_overlap=True)).json()
    other = api.post("/api/schedules", json=body(name="other")).json()
    engine = make_engine(db_url)
    factory = make_session_factory(engine)
    due = parse(schedule["next_run_at"])
    fired = [f for minute in range(2)
             for f in fire_due(session_factory=factory, now=due + dt.timedelta(minutes=minute))]
    assert [f.outcome for f in fired] == ["created", "created"]
    manual = api.post("/api/sweeps", json={**SKIPPED_ONLY, "name": "by hand"}).json()
    shown = api.get(f"/api/schedules/{schedule['id']}").json()
    assert [r["due_at"] for r in shown["runs"]] == [
        (due + dt.timedelta(minutes=m)).isoformat().replace("+00:00", "Z") for m in (1, 0)]
    assert [r["sweep_id"] for r in shown["runs"]] == [fired[1].sweep_id, fired[0].sweep_id]
    assert shown["last_run_at"] == shown["runs"][0]["due_at"]
    mine = api.get("/api/sweeps", params={"schedule_id": schedule["id"]}).json()
    assert mine["count"] == 2 and {s["schedule_id"] for s in mine["data"]} == {schedule["id"]}
    assert mine["data"][0]["name"].startswith("skip ") and mine["data"][0]["name"].endswith(
        " UTC")
    assert api.get("/api/sweeps", params={"schedule_id": other["id"]}).json()["count"] == 0
    assert api.get(f"/api/sweeps/{manual['id']}").json()["schedule_id"] is None

    deleted = api.delete(f"/api/schedules/{schedule['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert api.get(f"/api/schedules/{schedule['id']}").status_code == 404
    assert api.delete(f"/api/schedules/{schedule['id']}").status_code == 404
    for fired_one in fired:
        kept = api.get(f"/api/sweeps/{fired_one.sweep_id}").json()
        assert kept["schedule_id"] is None
    with factory() as session:
        assert session.scalar(select(func.count()).select_from(Sweep)) == 3
    engine.dispose()


def test_writes_pass_the_same_perimeter_as_sweeps(db_url):
    settings = api_settings(db_url, api_token="s3cret")
    with TestClient(create_app(settings)) as api:
        auth = {"Authorization": "Bearer s3cret"}
        assert api.post("/api/schedules", json=body()).status_code == 401
        created = api.post("/api/schedules", json=body(), headers=auth)
        assert created.status_code == 201
        path = f"/api/schedules/{created.json()['id']}"
        for method, url in (("PATCH", path), ("POST", path + "/pause"),
                            ("POST", path + "/resume"), ("DELETE", path)):
            assert api.request(method, url, json={}).status_code == 401, (method, url)
            cross = api.request(method, url, json={}, headers={
                **auth, "Origin": "https://evil.example"})
            assert cross.status_code == 403, (method, url)
        assert api.get(path).status_code == 200  # reads need no token
        huge = api.post("/api/schedules", headers=auth,
                        content=b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}')
        assert huge.status_code == 413
    assert schedule_count(db_url) == 1


# --- gdn-sweep schedule ---

def run_cli(*argv: str, capsys) -> tuple[int, str, str]:
    code = cli_main(["schedule", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def sweep_file(tmp_path):
    import yaml

    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(SKIPPED_ONLY))
    return path


def test_cli_adds_lists_shows_pauses_resumes_and_deletes(db_url, sweep_file, capsys):
    db = ("--db", db_url)
    code, out, _ = run_cli("add", "--name", "nightly", "--cron", "0 2 * * *", "--timezone",
                           "Europe/Berlin", str(sweep_file), *db, capsys=capsys)
    assert code == 0 and "schedule " in out and "CET" in out, out
    code, out, _ = run_cli("add", "--name", "often", "--cron", "*/5 * * * *", "--paused",
                           "--allow-overlap", str(sweep_file), *db, capsys=capsys)
    assert code == 0
    code, out, _ = run_cli("list", *db, capsys=capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["id", "name", "cron", "tz", "paused", "next",
                                              "run", "last", "run", "sweeps"]
    often, nightly = lines[1], lines[2]
    assert "often" in often and " yes " in often and "UTC" in often
    assert "nightly" in nightly and "Europe/Berlin" in nightly and "02:00 CET" in nightly
    assert lines[-1] == "2 schedule(s)"
    nightly_id = nightly.split()[0]
    code, out, _ = run_cli("show", nightly_id, *db, capsys=capsys)
    assert code == 0 and "0 2 * * * (Europe/Berlin)" in out and "0 sweep(s)" in out
    assert run_cli("pause", nightly_id, *db, capsys=capsys)[0] == 0
    assert run_cli("show", nightly_id, *db, capsys=capsys)[1].count("paused") == 1
    code, out, _ = run_cli("resume", nightly_id, *db, capsys=capsys)
    assert code == 0 and "next run" in out
    assert run_cli("delete", nightly_id, *db, capsys=capsys)[0] == 0
    code, _, err = run_cli("show", nightly_id, *db, capsys=capsys)
    assert code == 2 and err.strip() == f"schedule {nightly_id} not found (see `gdn-sweep " \
                                        "schedule list`)"
    assert schedule_count(db_url) == 1


@pytest.mark.parametrize(("args", "named"), [
    (("--cron", "0 2 * *"), "'0 2 * *'"),
    (("--cron", "0 2 * * *", "--timezone", "Mars/Olympus"), "'Mars/Olympus'"),
    (("--cron", "0 2 * * *", "--name", " "), "blank"),
], ids=["cron", "timezone", "name"])
def test_cli_refuses_bad_input_in_one_line_and_writes_nothing(db_url, sweep_file,
                                                               capsys, args, named):
    argv = ["add", "--name", "n", *args, str(sweep_file), "--db", db_url]
    code, out, err = run_cli(*argv, capsys=capsys)
    assert code == 2 and out == "" and named in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert schedule_count(db_url) == 0


def test_cli_refuses_a_bad_sweep_file_in_one_line(db_url, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodes: [ring]\n")
    for path, named in ((bad, "chips"), (tmp_path / "missing.yaml", "no such file")):
        code, _, err = run_cli("add", "--name", "n", "--cron", "0 2 * * *", str(path),
                               "--db", db_url, capsys=capsys)
        assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
    assert schedule_count(db_url) == 0


def test_cli_says_in_one_line_when_the_database_is_unreachable(capsys):
    from workers.process_probe import free_port

    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"
    code, _, err = run_cli("list", "--db", url, capsys=capsys)
    assert code == 1 and err.startswith("database unreachable: ") and len(
        err.strip().splitlines()) == 1
