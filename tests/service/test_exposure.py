"""Safe when exposed (issue 37 items 1 and 4): `serve` beyond loopback without a token refuses
to start (exit 2, the reason and both ways out); `--allow-unauthenticated` serves on purpose
and says so; a setting puts reads behind the token; the token never appears in a log line,
an answer or /api/health, and a wrong token is a 401 that names no secret and takes the same
time whatever it shares with the right one."""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.testclient import TestClient

from service.api.deps import require_token
from service.core.config import Settings
from service.main import create_app
from workers.process_probe import free_port

from .conftest import api_settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def _serve(tmp_path: Path, *args: str, token: str = "", **env) -> subprocess.Popen:
    """`gdn-sweep serve` on SQLite in tmp_path, without a scheduler (no Ray)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GDN_SWEEP_")},
           "DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}",
           "GDN_SWEEP_RUN_SCHEDULER": "false", "GDN_SWEEP_API_TOKEN": token, **env}
    return subprocess.Popen([sys.executable, "-m", "service.cli", "serve", *args],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_ready(port: int, process: subprocess.Popen, timeout_s: float = 60) -> httpx.Client:
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            if api.get("/api/health/live").status_code == 200:
                return api
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("serve did not answer")


def _stop(process: subprocess.Popen) -> str:
    process.terminate()
    out, _ = process.communicate(timeout=30)
    return out


@pytest.mark.timeout(60)
def test_serving_beyond_loopback_without_a_token_refuses_to_start(tmp_path):
    port = free_port()
    refused = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port))
    out, _ = refused.communicate(timeout=45)
    assert refused.returncode == 2, out
    assert "refusing to serve 0.0.0.0" in out
    assert "GDN_SWEEP_API_TOKEN" in out and "--allow-unauthenticated" in out
    with pytest.raises(httpx.ConnectError):  # nothing listens
        httpx.get(f"http://127.0.0.1:{port}/api/health/live", timeout=2)
    assert not (tmp_path / "serve.db").exists()  # refused before touching the database


@pytest.mark.timeout(90)
def test_allow_unauthenticated_serves_on_purpose_and_says_so(tmp_path):
    port = free_port()
    process = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port),
                     "--allow-unauthenticated")
    try:
        api = _wait_ready(port, process)
        options = api.get("/api/options").json()
        assert options["open_to_network"] is True and options["auth_required"] is False
    finally:
        out = _stop(process)
    assert "--allow-unauthenticated" in out and "anyone who reaches it" in out


@pytest.mark.timeout(90)
def test_the_token_never_appears_in_the_log_or_an_answer(tmp_path):
    token, wrong = f"tok-{secrets.token_hex(16)}", f"tok-{secrets.token_hex(16)}"
    port = free_port()
    process = _serve(tmp_path, "--port", str(port), "--log-level", "debug", token=token,
                     GDN_SWEEP_TOKEN_FOR_READS="true")
    answers = []
    try:
        api = _wait_ready(port, process)
        for headers in ({}, {"Authorization": f"Bearer {wrong}"},
                        {"Authorization": f"Bearer {token}"}):
            for method, path in (("GET", "/api/sweeps"), ("POST", "/api/sweeps/999/cancel"),
                                 ("GET", "/api/options"), ("GET", "/api/health"),
                                 ("GET", "/metrics"), ("GET", "/")):
                answers.append(api.request(method, path, headers=headers))
    finally:
        out = _stop(process)
    statuses = [a.status_code for a in answers]
    assert statuses[:6] == [401, 401, 401, 200, 200, 200]  # health, metrics, pages: open
    assert statuses[6:9] == [401, 401, 401]
    assert statuses[12:15] == [200, 404, 200]
    for answer in answers:
        assert token not in answer.text and wrong not in answer.text
        assert token not in str(answer.headers)
    assert "Bearer" in answers[7].headers["www-authenticate"]
    assert answers[7].json()["detail"] == "invalid bearer token"
    assert "401" in out and "/api/sweeps" in out  # the requests were logged, the tokens not
    assert token not in out and wrong not in out


def test_reads_behind_the_token_and_what_it_needs(db_url):
    settings = api_settings(db_url, api_token="s3cret", token_for_reads=True)
    with TestClient(create_app(settings)) as client:
        assert client.get("/api/results").status_code == 401
        assert client.get("/api/capacity?preset=tiny&seq_len=64&accelerator=cpu"
                          ).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert client.get("/api/results", headers=good).status_code == 200
        assert client.get("/api/options", headers=good).json()["reads_need_token"] is True
        assert client.get("/api/health/live").status_code == 200
    with pytest.raises(ValueError, match="GDN_SWEEP_TOKEN_FOR_READS=true needs "
                                         "GDN_SWEEP_API_TOKEN"):
        Settings(token_for_reads=True)


def test_a_wrong_token_takes_as_long_whatever_it_shares_with_the_right_one():
    """A plain `==` returns at the first differing byte: on a 1 MB token, one that shares
    all but its last byte would take ~1000× as long as one that differs at once."""
    right = "x" * 1_000_000
    settings = Settings(api_token=right)

    def seconds(candidate: str) -> float:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=candidate)
        runs = []
        for _ in range(30):
            start = time.perf_counter()
            with pytest.raises(Exception, match="invalid bearer token"):
                require_token(settings, credentials)
            runs.append(time.perf_counter() - start)
        return statistics.median(runs)

    shares_all_but_one, shares_none = seconds("x" * 999_999 + "y"), seconds("y" * 1_000_000)
    assert 0.5 < shares_all_but_one / shares_none < 2.0, (shares_all_but_one, shares_none)


@pytest.mark.timeout(60)
def test_the_demo_refuses_a_network_without_a_token_too(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GDN_SWEEP_")},
           "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.db'}"}
    refused = subprocess.run([sys.executable, "-m", "service.demo", "--host", "0.0.0.0",
                              "--port", str(free_port()), "--no-demo-sweep"], cwd=REPO_ROOT,
                             env=env, capture_output=True, text=True, timeout=45)
    assert refused.returncode == 2, refused.stderr
    assert "refusing to serve 0.0.0.0" in refused.stderr and "--allow-unauthenticated" in \
        refused.stderr
    assert not (tmp_path / "demo.db").exists()
