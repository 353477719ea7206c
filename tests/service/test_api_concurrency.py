"""50 sweeps submitted at once while 500 reads run, against a real uvicorn on SQLite and
PostgreSQL: no 5xx, every accepted sweep has all its trial rows, nothing is written twice."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import func, select

from service.db.engine import make_engine, make_session_factory
from service.db.models import Sweep, Trial

from .conftest import TINY_SWEEP

SUBMISSIONS, READS = 50, 500


async def _storm(base_url: str) -> tuple[list[httpx.Response], list[httpx.Response]]:
    limits = httpx.Limits(max_connections=SUBMISSIONS + READS)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        posts = [client.post("/api/sweeps", json={**TINY_SWEEP, "name": f"storm-{i}",
                                                  "seq_lens": [32, 64, 128]})
                 for i in range(SUBMISSIONS)]
        paths = ("/api/sweeps", "/api/sweeps/1", "/api/results?limit=50&chips=1",
                 "/api/sweeps/1/trials", "/api/options", "/api/health")
        gets = [client.get(paths[i % len(paths)]) for i in range(READS)]
        responses = await asyncio.gather(*posts, *gets)
    return list(responses[:SUBMISSIONS]), list(responses[SUBMISSIONS:])


@pytest.mark.slow  # a load run (10-15 s); concurrent reads by default: test_api_read_concurrency
@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_fifty_submissions_and_five_hundred_reads_at_once(api_server, db_url):
    posts, gets = asyncio.run(_storm(api_server))
    assert [r.status_code for r in posts] == [201] * SUBMISSIONS, [r.text for r in posts
                                                                   if r.status_code != 201][:3]
    statuses = {r.status_code for r in gets}
    assert statuses <= {200, 404}, [r.text for r in gets if r.status_code >= 500][:3]
    ids = {r.json()["id"] for r in posts}
    assert len(ids) == SUBMISSIONS
    engine = make_engine(db_url)
    try:
        with make_session_factory(engine)() as session:
            assert session.scalar(select(func.count()).select_from(Sweep)) == SUBMISSIONS
            per_sweep = dict(session.execute(select(Trial.sweep_id, func.count())
                                             .group_by(Trial.sweep_id)).all())
    finally:
        engine.dispose()
    assert per_sweep == {sweep_id: 3 for sweep_id in ids}
