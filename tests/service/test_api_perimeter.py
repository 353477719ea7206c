"""The API's perimeter: a database outage answers JSON 503s and heals, health says nothing of
the deployment, bodies over the limit get 413, cross-origin writes 403, unknown Hosts 400, and
every response carries the security headers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from service.api.guards import DATABASE_UNAVAILABLE, RETRY_AFTER_S
from service.core.config import Settings
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Sweep
from service.main import create_app

from .conftest import (
    TINY_SWEEP,
    api_settings,
    scratch_postgres_database,
    serving,
)
from .private_postgres import PrivatePostgres, free_port
from .seed import seed_sweep

MiB = 1024 * 1024


def assert_database_unavailable(http, hidden: list[str]) -> None:
    """Every kind of endpoint answers the JSON 503; liveness stays up; nothing in any body
    names where the database is."""
    calls = [("GET", "/api/sweeps"), ("GET", "/api/sweeps/1"), ("GET", "/api/sweeps/1/trials"),
             ("GET", "/api/results"), ("GET", "/api/trials/1"), ("POST", "/api/sweeps"),
             ("POST", "/api/sweeps/1/cancel")]
    for method, path in calls:
        r = http.request(method, path, json=TINY_SWEEP if path == "/api/sweeps" else None)
        assert r.status_code == 503, (method, path, r.text)
        assert r.json() == {"detail": DATABASE_UNAVAILABLE}, (method, path)
        assert r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert http.get("/api/health/live").json() == {"status": "ok"}
    for path in ("/api/health/ready", "/api/health"):
        r = http.get(path)
        assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
        assert r.json()["database"]["ok"] is False
        assert r.json()["database"]["detail"].endswith("unreachable (OperationalError)")
        for secret in hidden:
            assert secret not in r.text, (secret, r.text)


@pytest.mark.timeout(180)
def test_postgres_outage_answers_503_and_recovers():
    with PrivatePostgres() as pg:
        upgrade_database(pg.url)
        with serving(api_settings(pg.url)) as base, httpx.Client(base_url=base) as http:
            assert http.post("/api/sweeps", json=TINY_SWEEP).json()["id"] == 1
            pg.stop()
            assert_database_unavailable(http, hidden=[str(pg.port), "postgres@", "127.0.0.1",
                                                      pg.database])
            pg.start()
            # the pool's pre-ping replaces the dead connections: the same server heals
            for path in ("/api/sweeps", "/api/sweeps/1", "/api/results", "/api/health/ready"):
                assert http.get(path).status_code == 200, path
            assert http.post("/api/sweeps", json=TINY_SWEEP).status_code == 201


def test_closed_port_answers_503():
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/gdn_sweep"
    with TestClient(create_app(api_settings(url))) as client:
        assert_database_unavailable(client, hidden=[str(port), "postgres@", "127.0.0.1",
                                                    "gdn_sweep"])


def test_unopenable_sqlite_file_answers_503_without_its_path(tmp_path):
    path = tmp_path / "no-such-dir" / "results.db"
    with TestClient(create_app(api_settings(f"sqlite:///{path}"))) as client:
        assert_database_unavailable(client, hidden=[str(tmp_path), "results.db"])


def test_a_database_error_that_is_no_outage_stays_a_500():
    # An unmigrated PostgreSQL answers "relation does not exist" (ProgrammingError): a fault to
    # fix, not a reason to retry later.
    with scratch_postgres_database("gdn_sweep_unmigrated") as url:
        app = create_app(api_settings(url))
        with TestClient(app, raise_server_exceptions=False) as client:
            assert client.get("/api/sweeps").status_code == 500
            assert client.get("/api/health/ready").status_code == 200  # it does answer


def test_health_names_the_backend_and_nothing_else(client, db_url):
    url = make_url(db_url)
    r = client.get("/api/health/ready")
    assert r.status_code == 200
    assert r.json()["database"] == {"ok": True, "detail": f"{url.get_backend_name()} reachable"}
    assert client.get("/api/health").json() == r.json()
    # (the user name alone, "postgres", is part of the backend's name)
    hidden = [url.database] + ([f"{url.username}@", str(url.port), url.host] if url.host else [])
    for secret in hidden:
        assert secret not in r.text, secret


@pytest.mark.timeout(120)
def test_bodies_over_the_limit_get_413(db_url, session_factory):
    def chunked(total: int) -> Iterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(total // 65536):
            yield b" " * 65536

    with serving(api_settings(db_url)) as base, httpx.Client(base_url=base) as http:
        declared = http.post("/api/sweeps", content=b" " * (2 * MiB),
                             headers={"Content-Type": "application/json"})
        streamed = http.post("/api/sweeps", content=chunked(2 * MiB),
                             headers={"Content-Type": "application/json"})
        for r in (declared, streamed):
            assert r.status_code == 413, r.text
            assert "1048576 bytes" in r.json()["detail"]
        assert streamed.request.headers["transfer-encoding"] == "chunked"
        with session_factory() as session:
            assert session.scalar(select(func.count()).select_from(Sweep)) == 0
        # under the limit, a body that arrives in many chunks reaches the route whole
        body = b" " * (MiB - 4096) + json.dumps(TINY_SWEEP).encode()
        r = http.post("/api/sweeps", content=iter([body[i:i + 65536]
                                                   for i in range(0, len(body), 65536)]),
                      headers={"Content-Type": "application/json"})
        assert r.status_code == 201, r.text


@pytest.fixture
def queued_sweep(client) -> int:
    return client.post("/api/sweeps", json=TINY_SWEEP).json()["id"]


def test_cross_origin_writes_are_refused(client, queued_sweep):
    cancel = f"/api/sweeps/{queued_sweep}/cancel"
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Origin": "http://testserver:8080"},  # another port is another origin
                    {"Sec-Fetch-Site": "cross-site"}):
        r = client.post(cancel, headers=headers)
        assert r.status_code == 403, headers
        assert "cross-origin POST refused" in r.json()["detail"]
    assert client.get(f"/api/sweeps/{queued_sweep}").json()["status"] == "queued"
    assert client.get("/api/sweeps", headers={"Origin": "http://evil.example"}).status_code == 200
    r = client.post(cancel, headers={"Origin": "http://testserver",
                                     "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 202 and r.json()["status"] == "cancelled"


def test_allowed_origins_may_write(db_url):
    settings = api_settings(db_url, allowed_origins="https://sweeps.example.com/")
    with TestClient(create_app(settings)) as client:
        r = client.post("/api/sweeps", json=TINY_SWEEP,
                        headers={"Origin": "https://sweeps.example.com",
                                 "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 201, r.text
        r = client.post("/api/sweeps", json=TINY_SWEEP, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403


def test_unknown_hosts_are_refused(client):
    for host in ("evil.example", "localhost.evil.example", "127.0.0.1.evil.example:80"):
        for path in ("/", "/api/sweeps", "/api/health/live"):
            r = client.get(path, headers={"Host": host})
            assert r.status_code == 400, (host, path)
            assert "GDN_SWEEP_ALLOWED_HOSTS" in r.json()["detail"]
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "LOCALHOST."):
        assert client.get("/api/health/live", headers={"Host": host}).status_code == 200, host


@pytest.mark.timeout(60)
def test_a_live_server_answers_the_address_it_listens_on(db_url):
    settings = api_settings(db_url, allowed_hosts="sweeps.internal")
    with serving(settings) as base, httpx.Client(base_url=base) as http:
        port = base.rsplit(":", 1)[1]
        assert http.get("/api/health/live").status_code == 200  # Host: 127.0.0.1:port
        assert http.get("/api/health/live",
                        headers={"Host": f"sweeps.internal:{port}"}).status_code == 200
        # localhost is no longer listed; a rebound DNS name never was
        for host in (f"localhost:{port}", f"evil.example:{port}"):
            assert http.get("/api/health/live", headers={"Host": host}).status_code == 400
        r = http.post("/api/sweeps", json=TINY_SWEEP, headers={"Origin": base})
        assert r.status_code == 201, r.text  # what a browser sends for the dashboard's POST


def test_security_headers_on_every_response(client):
    responses = [client.get("/"), client.get("/sweeps/1"), client.get("/static/common.js"),
                 client.get("/api/sweeps"), client.get("/api/sweeps/999"),
                 client.post("/api/sweeps", json={}),
                 client.get("/api/sweeps", headers={"Host": "evil.example"})]
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 404, 422, 400]
    for r in responses:
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "script-src 'self';" in csp and "unsafe-inline" not in csp
    docs = client.get("/docs")  # Swagger UI from this origin, its inline start by hash
    assert "http" not in docs.headers["content-security-policy"]  # no CDN
    assert "unsafe-inline" not in docs.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]


def test_settings_read_lists_from_the_environment(monkeypatch):
    monkeypatch.setenv("GDN_SWEEP_ALLOWED_HOSTS", "sweeps.internal, 10.0.0.5")
    monkeypatch.setenv("GDN_SWEEP_ALLOWED_ORIGINS", '["https://Sweeps.example.com/"]')
    monkeypatch.setenv("GDN_SWEEP_MAX_REQUEST_BYTES", "4096")
    settings = Settings()
    assert settings.allowed_hosts == ["sweeps.internal", "10.0.0.5"]
    assert settings.allowed_origins == ["https://sweeps.example.com"]
    assert settings.max_request_bytes == 4096
    assert Settings.model_fields["allowed_hosts"].default == ["127.0.0.1", "localhost", "::1"]


CSP_VIOLATIONS = """window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__csp.push({directive: e.violatedDirective, source: e.sourceFile}));"""


@pytest.mark.timeout(120)
def test_the_dashboard_runs_under_its_csp(tmp_path, page):
    url = f"sqlite:///{tmp_path / 'csp.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    seed_sweep(make_session_factory(engine), modes=["all_gather", "p2p"], chips=[1, 2])
    engine.dispose()
    page.add_init_script(CSP_VIOLATIONS)
    with serving(api_settings(url)) as base:
        for path, drawn in (("/", "#sweeps tbody tr"), ("/results", "#results tbody tr")):
            page.goto(base + path)
            page.wait_for_selector(drawn)
            assert page.evaluate("window.__csp") == [], path
        page.goto(base + "/sweeps/1")
        page.wait_for_selector("#plot-memory svg.main-svg")
        page.hover("#plot-throughput .nsewdrag")  # a panel's plot area: hover labels
        # plotly's own rules arrive through the empty <style> the CSP admits by its hash
        assert page.evaluate("document.getElementById('plotly.js-style-global')"
                             ".sheet.cssRules.length") > 10
        # none refused: the maplibre CSS plotly's bundle injects is admitted by its hash
        assert page.evaluate("window.__csp") == []
        assert page.locator(".progress > div").first.evaluate("d => d.style.width") != ""
