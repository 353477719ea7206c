"""GET /api/results pages are cached per process under the `results` counter, which triggers
bump in the writing transaction: a page is served from the cache only while no succeeded result
was written, by the service or by anyone else's SQL; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.db.read_cache import ResponseCache, data_version
from service.main import create_app

from .conftest import api_settings
from .seed import seed_sweep


def version(session_factory) -> int:
    with session_factory() as session:
        return data_version(session, "results")


@pytest.fixture
def cached(db_url):
    app = create_app(api_settings(db_url))
    with TestClient(app) as test_client:
        yield test_client, app.state.results_cache


def test_a_repeated_read_is_served_from_the_cache_until_a_result_is_written(
        cached, session_factory):
    client, cache = cached
    seed_sweep(session_factory, name="first", modes=["p2p"], chips=[2], seq_lens=[64])
    params = {"mode": "p2p", "sort": "-tokens_per_s_per_chip"}
    first = client.get("/api/results", params=params)
    again = client.get("/api/results", params=params)
    assert (cache.misses, cache.hits) == (1, 1)
    assert again.content == first.content and again.headers["content-type"] == \
        "application/json"
    assert first.json()["count"] == 1

    seed_sweep(session_factory, name="second", modes=["p2p"], chips=[2], seq_lens=[128])
    after = client.get("/api/results", params=params).json()
    assert after["count"] == 2 and cache.misses == 2
    # the same filters spelled another way are the same entry
    assert client.get("/api/results", params={"sort": "-tokens_per_s_per_chip",
                                              "mode": ["p2p"]}).json() == after
    assert cache.hits == 2


def test_only_writes_of_succeeded_results_move_the_counter_whoever_writes_them(
        cached, session_factory):
    client, cache = cached
    before = version(session_factory)
    seed_sweep(session_factory, name="failed", modes=["p2p"], chips=[2], seq_lens=[64],
               status_of=lambda t: "failed")
    assert version(session_factory) == before  # nothing /api/results shows changed
    seed_sweep(session_factory, name="ok", modes=["p2p"], chips=[1, 2], seq_lens=[64])
    assert version(session_factory) == before + 2  # the p2p trial and its one-chip baseline
    page = client.get("/api/results", params={"mode": "p2p"}).json()
    (row,) = page["data"]

    # Plain SQL, not the service's code: the triggers still see it.
    with session_factory() as session:
        session.execute(text("UPDATE results SET tokens_per_s_per_chip = 1.5 "
                             "WHERE trial_id = :id"), {"id": row["id"]})
        session.commit()
    assert client.get("/api/results", params={"mode": "p2p"}).json()["data"][0][
        "tokens_per_s_per_chip"] == 1.5
    with session_factory() as session:
        session.execute(text("DELETE FROM trial_attempts WHERE trial_id = :id"),
                        {"id": row["id"]})
        session.execute(text("DELETE FROM results WHERE trial_id = :id"), {"id": row["id"]})
        session.commit()
    assert client.get("/api/results", params={"mode": "p2p"}).json()["count"] == 0
    assert version(session_factory) == before + 4
    assert cache.hits == 0


def test_without_its_counter_row_nothing_is_cached(cached, session_factory):
    client, cache = cached
    seed_sweep(session_factory, name="ok", modes=["p2p"], chips=[1, 2], seq_lens=[64])
    with session_factory() as session:
        session.execute(text("DELETE FROM cache_versions"))
        session.commit()
    try:
        assert client.get("/api/results").json()["count"] == 2
        seed_sweep(session_factory, name="more", modes=["p2p"], chips=[1, 2], seq_lens=[128])
        assert client.get("/api/results").json()["count"] == 4  # no trigger counted it
        assert cache.hits == 0
    finally:
        with session_factory() as session:
            session.execute(text("INSERT INTO cache_versions (name, version) "
                                 "VALUES ('results', 0)"))
            session.commit()


def test_cached_pages_are_the_uncached_pages(db_url, session_factory):
    seed_sweep(session_factory, name="cpu", modes=["all_gather", "p2p"], chips=[1, 2, 4],
               seq_lens=[64, 128], attempts_of=lambda t: 2 if t.chips == 4 else 1)
    queries = [{}, {"mode": "p2p", "limit": 2, "offset": 1}, {"sort": "mfu,-seq_len"},
               {"chips": [2, 4], "seq_len_min": 100}]
    with TestClient(create_app(api_settings(db_url, results_cache_entries=0))) as uncached:
        want = [uncached.get("/api/results", params=q).content for q in queries]
        assert uncached.app.state.results_cache.hits == 0
    with TestClient(create_app(api_settings(db_url))) as client:
        for _ in range(2):
            assert [client.get("/api/results", params=q).content for q in queries] == want
        assert client.app.state.results_cache.hits == len(queries)


def test_the_cache_keeps_the_newest_version_the_most_recent_keys_and_small_bodies():
    cache = ResponseCache(max_entries=2, max_bytes=100)
    cache.put("a", 1, b"a@1")
    assert cache.get("a", 1) == b"a@1" and cache.get("a", 2) is None
    cache.put("a", 3, b"a@3")
    cache.put("a", 2, b"a@2")  # read an older counter: it does not replace the newer body
    assert cache.get("a", 3) == b"a@3"
    cache.put("b", 1, b"b")
    cache.get("a", 3)
    cache.put("c", 1, b"c")  # over 2 entries: b, the least recently used, goes
    assert cache.get("b", 1) is None and cache.get("a", 3) == b"a@3"
    cache.put("big", 1, b"x" * 11)  # over a tenth of max_bytes: not kept
    assert cache.get("big", 1) is None
    sized = ResponseCache(max_entries=10, max_bytes=20)
    for key in "abc":
        sized.put(key, 1, b"12")
    sized.put("a", 2, b"1")  # replacing a body counts its size once
    sized.put("d", 1, b"12")
    assert [sized.get(k, v) for k, v in (("a", 2), ("b", 1), ("c", 1), ("d", 1))] == [
        b"1", b"12", b"12", b"12"]
    for key in "efghijkl":
        sized.put(key, 1, b"12")  # 10 entries and 20 bytes hold: the oldest go
    assert sized._bytes <= 20 and len(sized._bodies) == 10
    assert sized.get("a", 2) is None and sized.get("l", 1) == b"12"
    off = ResponseCache(max_entries=0)
    off.put("a", 1, b"a")
    assert off.get("a", 1) is None


def test_a_capacity_answer_is_cached_until_a_result_is_written(cached, session_factory):
    """GET /api/capacity: the same request again is the cache's (its hit counter says so, and
    the body is byte for byte the first); a new succeeded result moves the counter, so the
    next answer is computed again and rests on it."""
    client, cache = cached
    seed_sweep(session_factory, name="first", frameworks=["jax"], modes=["p2p"], chips=[1, 2],
               seq_lens=[256])
    params = {"preset": "tiny", "num_layers": 1, "seq_len": 512, "accelerator": "cpu",
              "dtype": "float32", "max_chips": 2, "modes": "p2p"}
    first = client.get("/api/capacity", params=params)
    again = client.get("/api/capacity", params=params)
    assert first.status_code == 200 and (cache.misses, cache.hits) == (1, 1)
    assert again.content == first.content and first.json()["evidence_trials"] == 2
    # the same request spelled another way (a list of one, the default written out)
    assert client.get("/api/capacity", params={**params, "modes": ["p2p"],
                                               "batch_size": 1}).content == first.content
    assert cache.hits == 2
    other = client.get("/api/capacity", params={**params, "seq_len": 1024})
    assert other.content != first.content and cache.misses == 2

    seed_sweep(session_factory, name="second", frameworks=["jax"], modes=["p2p"],
               chips=[1, 2], seq_lens=[512])
    after = client.get("/api/capacity", params=params)
    assert cache.misses == 3 and cache.hits == 2
    assert after.json()["evidence_trials"] == 4
    assert after.json()["fewest_chips"]["step_time_s"]["basis"] == "measured"
    bad = client.get("/api/capacity", params={**params, "seq_len": 0})
    assert bad.status_code == 422 and "seq_len" in bad.text
