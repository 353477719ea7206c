"""Fixtures of the service tests: SQLite and a throw-away PostgreSQL database (both migrated
with Alembic), API clients on either, and one local Ray shared by the tests that run sweeps.

PostgreSQL: the suite creates `gdn_sweep_test_<random>` on the server of
$GDN_SWEEP_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres) and drops
it at the end. Without a reachable server the PostgreSQL cases are skipped, saying why, or,
under GDN_SWEEP_REQUIRE_POSTGRES (CI), fail.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.core.config import Settings
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.main import create_app

PG_ADMIN_URL = os.environ.get("GDN_SWEEP_TEST_POSTGRES_URL",
                              "postgresql://postgres@127.0.0.1:5432/postgres")


def _psycopg_conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


REQUIRE_POSTGRES_ENV = "GDN_SWEEP_REQUIRE_POSTGRES"
"""Set (.ci/run sets it): a PostgreSQL case whose server is missing fails instead of skipping,
so a run cannot go green on SQLite alone."""


def postgres_missing(why: str):
    """Skip the PostgreSQL case for `why`; fail it where REQUIRE_POSTGRES_ENV is set."""
    if os.environ.get(REQUIRE_POSTGRES_ENV):
        pytest.fail(f"{why} ({REQUIRE_POSTGRES_ENV} is set: PostgreSQL cases must run)",
                    pytrace=False)
    pytest.skip(why)


@contextmanager
def scratch_postgres_database(prefix: str) -> Iterator[str]:
    """A new empty database `<prefix>_<random>` on the server of PG_ADMIN_URL (the test is
    skipped when that server is unreachable), dropped afterwards; yields its URL."""
    import psycopg

    name = f"{prefix}_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(_psycopg_conninfo(PG_ADMIN_URL), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        postgres_missing(f"PostgreSQL not reachable at {PG_ADMIN_URL} "
                         f"(set GDN_SWEEP_TEST_POSTGRES_URL): {err}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg", database=name) \
            .render_as_string(hide_password=False)
    finally:
        with psycopg.connect(_psycopg_conninfo(PG_ADMIN_URL), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The app for `settings` on a real uvicorn server in a thread; yields its base URL."""
    import uvicorn

    from .private_postgres import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    with scratch_postgres_database("gdn_sweep_test") as url:
        upgrade_database(url)
        yield url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'service.db'}"
    upgrade_database(url)
    return url


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items) -> None:
    """A browser test's PostgreSQL case runs in the slow tier: the browser reaches the database
    only through the API, whose own tests run on both kinds by default."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "browser" in getattr(item, "fixturenames", ()) and params.get("db_url") == "postgresql":
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """A migrated, emptied database of each kind."""
    url = request.getfixturevalue(f"{request.param}_url")
    engine = make_engine(url)
    with engine.begin() as conn:
        for table in ("results", "environments", "trials", "sweeps", "schedule_runs",
                      "regression_alerts",
                      "schedules"):
            conn.execute(text(f"DELETE FROM {table}"))
    engine.dispose()
    return url


@pytest.fixture
def session_factory(db_url):
    engine = make_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


def api_settings(db_url: str, **overrides) -> Settings:
    return Settings(database_url=db_url, run_scheduler=False, upgrade_on_start=False,
                    grid_cap=64, **overrides)


@pytest.fixture
def client(db_url) -> Iterator[TestClient]:
    """The API with no scheduler: sweeps stay queued (what the API writes is what we check)."""
    with TestClient(create_app(api_settings(db_url))) as test_client:
        yield test_client


@pytest.fixture
def api_server(db_url) -> Iterator[str]:
    """A real uvicorn (in a thread) serving the API on `db_url`, no scheduler: its base URL."""
    with serving(api_settings(db_url)) as base_url:
        yield base_url


@pytest.fixture(scope="package")
def local_ray():
    """One local Ray (4 virtual CPU chips) for every sweep-running test of this package."""
    import ray

    from workers.cluster import connect_ray

    already = ray.is_initialized()
    info = connect_ray("", cpu_chips=4)
    yield info
    if not already:
        ray.shutdown()


TINY_SWEEP = {
    "name": "tiny", "frameworks": ["torch"], "modes": ["all_gather"], "chips": [1],
    "seq_lens": [64], "model": {"preset": "tiny", "num_layers": 1}, "steps": 1,
    "warmup_steps": 1, "accelerator": {"kind": "cpu", "type": "cpu"},
}
"""A sweep that runs in well under a second per trial once its workers are warm."""


@pytest.fixture(scope="module")
def browser():
    """A real chromium (tests/service/browser.py), one per test module (each test has tabs of
    its own, in a context of its own)."""
    from .browser import chromium

    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser):
    """A 1400×900 en-US tab; the test fails when the page logged a console error."""
    from .browser import assert_no_console_errors, window_page

    tab = window_page(browser)
    yield tab
    tab.context.close()
    assert_no_console_errors(tab)


@pytest.fixture
def csp_page(browser):
    """A 1400×900 en-US tab that records what the CSP refused in window.__csp; the test
    fails when the page logged a console error."""
    from .browser import assert_no_console_errors, window_page

    tab = window_page(browser, record_csp=True)
    yield tab
    tab.context.close()
    assert_no_console_errors(tab)
