"""Idempotency-Key on POST /api/sweeps, on SQLite and PostgreSQL: a retried request answers the
sweep the first one created, another body under the same key is a 409, and two requests
racing with one key make one sweep."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from sqlalchemy import func, select, text

from service.db import crud
from service.db.engine import is_sqlite
from service.db.models import IdempotencyKey, Sweep, utcnow
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP, api_settings, serving


def count(session_factory, model) -> int:
    with session_factory() as session:
        return session.scalar(select(func.count()).select_from(model))


def test_a_repeated_key_answers_the_first_sweep(client, session_factory):
    first = client.post("/api/sweeps", json=TINY_SWEEP, headers={"Idempotency-Key": "run-1"})
    assert first.status_code == 201, first.text
    # the same spec spelled differently (indentation, key order) is the same request
    respelled = json.dumps(dict(reversed(TINY_SWEEP.items())), indent=4)
    again = client.post("/api/sweeps", content=respelled, headers={
        "Idempotency-Key": "run-1", "Content-Type": "application/json"})
    assert again.status_code == 200, again.text
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert count(session_factory, Sweep) == 1 and count(session_factory, IdempotencyKey) == 1
    other_key = client.post("/api/sweeps", json=TINY_SWEEP, headers={"Idempotency-Key": "run-2"})
    assert other_key.status_code == 201 and other_key.json()["id"] != first.json()["id"]
    assert client.post("/api/sweeps", json=TINY_SWEEP).status_code == 201  # no key: no replay
    assert count(session_factory, Sweep) == 3


def test_the_key_with_another_body_is_a_conflict(client, session_factory):
    first = client.post("/api/sweeps", json=TINY_SWEEP, headers={"Idempotency-Key": "run-1"})
    r = client.post("/api/sweeps", json={**TINY_SWEEP, "seq_lens": [128]},
                    headers={"Idempotency-Key": "run-1"})
    assert r.status_code == 409
    assert "'run-1'" in r.json()["detail"] and f"sweep {first.json()['id']}" in r.json()["detail"]
    assert count(session_factory, Sweep) == 1


@pytest.mark.parametrize("key", ["", "x" * 201, "caf\u00e9".encode(), "tab\there", "\x7f"])
def test_keys_must_be_1_to_200_printable_ascii_characters(client, session_factory, key):
    r = client.post("/api/sweeps", json=TINY_SWEEP, headers={"Idempotency-Key": key})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert count(session_factory, Sweep) == 0


def test_a_200_character_key_with_spaces_is_accepted(client):
    key = "a b~" * 50
    assert client.post("/api/sweeps", json=TINY_SWEEP,
                       headers={"Idempotency-Key": key}).status_code == 201
    assert client.post("/api/sweeps", json=TINY_SWEEP,
                       headers={"Idempotency-Key": key}).status_code == 200


@pytest.mark.timeout(120)
def test_two_requests_at_once_with_one_key_make_one_sweep(db_url, session_factory):
    with serving(api_settings(db_url)) as base:
        for attempt in range(5):  # several rounds: the requests overlap differently each time
            key = f"race-{attempt}"
            start = threading.Barrier(2)
            answers: list[httpx.Response] = []

            def post() -> None:
                with httpx.Client(base_url=base, timeout=60) as http:
                    start.wait()
                    answers.append(http.post("/api/sweeps", json=TINY_SWEEP,
                                             headers={"Idempotency-Key": key}))

            threads = [threading.Thread(target=post) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert sorted(r.status_code for r in answers) == [200, 201], [r.text for r in answers]
            assert answers[0].json() == answers[1].json()
    assert count(session_factory, Sweep) == 5


@pytest.mark.timeout(120)
def test_a_key_committed_while_the_request_inserts_wins(db_url, session_factory):
    # Another request holds the key in an open transaction: this one finds no key yet, blocks
    # on inserting it, and once the other commits answers that sweep (its own rolled back).
    spec = SweepSpec.model_validate(TINY_SWEEP)
    holder = session_factory()
    sweep = Sweep(name=spec.name, status="queued", spec=spec.model_dump(mode="json"),
                  trials_total=1, trials_skipped=0, created_at=utcnow())
    holder.add(sweep)
    holder.flush()
    holder.add(IdempotencyKey(key="held", request_hash=crud.spec_hash(spec), sweep_id=sweep.id,
                              created_at=utcnow()))
    holder.flush()
    answers: list[httpx.Response] = []
    with serving(api_settings(db_url)) as base:
        def post() -> None:
            answers.append(httpx.post(base + "/api/sweeps", json=TINY_SWEEP, timeout=60,
                                      headers={"Idempotency-Key": "held"}))

        thread = threading.Thread(target=post)
        thread.start()
        _wait_until_blocked(db_url, session_factory)
        holder.commit()
        holder.close()
        thread.join(60)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    assert answers[0].json()["id"] == sweep.id
    assert count(session_factory, Sweep) == 1


def _wait_until_blocked(db_url: str, session_factory) -> None:
    """Until a PostgreSQL backend waits on a lock (the request's insert of the held key); on
    SQLite, which cannot show it, a second (the request waits on the write lock meanwhile)."""
    if is_sqlite(db_url):
        time.sleep(1)
        return
    deadline = time.monotonic() + 30
    with session_factory() as watcher:
        while not watcher.scalar(text("SELECT count(*) FROM pg_stat_activity "
                                      "WHERE wait_event_type = 'Lock' "
                                      "AND datname = current_database()")):
            assert time.monotonic() < deadline, "the request never waited on the held key"
            time.sleep(0.05)
            watcher.rollback()
