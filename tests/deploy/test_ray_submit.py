"""`ray up` and `ray submit` for real: deploy/cluster-cpu.yaml as a one-host cluster whose head
is this machine, reached over SSH (a private sshd of the test's own on a loopback address),
running deploy/run_sweep.py into a scratch PostgreSQL database.

The test's cluster config is deploy/cluster-cpu.yaml with what must differ here swapped in:
the provider (this machine at a random 127.x.y.z, no workers), the SSH user and key, the
setup commands (this package is already installed on this machine: they check it is, and keep
the shipped one that makes the head's shells token-mode Ray clients), and the
head's start command, which keeps the shipped one (its quoting of `--resources`, token auth,
the autoscaling config) but drops `ray stop` (it would stop every Ray on the machine) and adds
ports of its own and 127.0.0.1 only. Every Ray file lands under the test's temp dir ($TMPDIR
of the client and of the head's SSH sessions), so the head's `auto` address is this cluster.
Teardown kills exactly the processes naming that temp dir and the sshd it started; it never
runs `ray down`, whose hard-coded `ray stop` on the head would stop other Rays too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from getpass import getuser
from pathlib import Path

import pytest
import ray  # noqa: F401 - puts Ray's bundled psutil on sys.path
import yaml
from sqlalchemy import create_engine, text

from workers.process_probe import free_port

import psutil  # noqa: E402 - after ray (above)

REPO_ROOT = Path(__file__).resolve().parents[2]
SSHD = Path("/usr/sbin/sshd")
TINY_SWEEP = {"name": "ray-submit-e2e", "frameworks": ["torch", "jax"], "modes": ["all_gather"],
              "chips": [1], "seq_lens": [64], "model": {"preset": "tiny", "num_layers": 1},
              "steps": 1, "warmup_steps": 0, "verify": False,
              "accelerator": {"kind": "cpu", "type": "cpu"}, "trial_timeout_s": 300}
RAY_PORT_FLAGS = ("port", "dashboard-port", "ray-client-server-port", "node-manager-port",
                  "object-manager-port", "dashboard-agent-listen-port",
                  "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")

pytestmark = pytest.mark.slow


@dataclasses.dataclass
class LoopbackHost:
    """This machine as a cluster host: a private sshd on `address`:22 accepting `key` for
    root; sessions get HOME=`home` (so ~ on "the head" is the test's) and TMPDIR=`tmp`."""

    address: str
    key: Path
    home: Path
    tmp: Path
    sshd: subprocess.Popen


def _free_loopback_address() -> str:
    """A random 127.x.y.z whose port 22 is free (Ray's SSH runner always uses port 22)."""
    for _ in range(50):
        address = f"127.{random.randrange(20, 250)}.{random.randrange(1, 250)}." \
                  f"{random.randrange(2, 250)}"
        with socket.socket() as sock:
            try:
                sock.bind((address, 22))
                return address
            except OSError:
                continue
    pytest.skip("no loopback address with a free port 22 (does an sshd listen on 0.0.0.0:22?)")


def _ssh(host: LoopbackHost, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(host.key), "-o", "StrictHostKeyChecking=no", "-o",
         "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "LogLevel=ERROR", f"root@{host.address}", command],
        capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def private_sshd(root: Path) -> Iterator[LoopbackHost]:
    """Debian's sshd with a config, host key and authorized_keys of its own under `root`; the
    machine's own sshd and root's ~/.ssh are not touched."""
    if not SSHD.exists():
        pytest.skip(f"{SSHD} missing: apt-get install openssh-server (scripts/test.sh does)")
    home, tmp = root / "head", root / "t"
    for folder in (home, tmp):
        folder.mkdir()
    # Ray's command runner runs `bash --login` (its /etc/profile resets PATH), then `source
    # ~/.bashrc`: there this Python comes first, as the shipped setup puts its venv, and the
    # commands start where the head's files are.
    (home / ".bashrc").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
                                  f'cd "$HOME"\n')
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)],
                       check=True)
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    address = _free_loopback_address()
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin",
                            "/bin"])  # for plain `ssh host command` (no login shell)
    (root / "sshd_config").write_text(f"""\
ListenAddress {address}:22
HostKey {root / 'host_key'}
PidFile {root / 'sshd.pid'}
AuthorizedKeysFile {root / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
SetEnv HOME={home} TMPDIR={tmp} PATH={path}
""")
    # sshd's privilege-separation directory (Debian's service creates it at boot)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = (root / "sshd.log").open("w")
    sshd = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(root / "sshd_config")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    host = LoopbackHost(address=address, key=root / "client_key", home=home, tmp=tmp,
                        sshd=sshd)
    try:
        deadline = time.monotonic() + 20
        while _ssh(host, "true").returncode != 0:
            assert sshd.poll() is None, (root / "sshd.log").read_text()
            assert time.monotonic() < deadline, "the private sshd did not accept the key"
            time.sleep(0.2)
        yield host
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sshd.pid, signal.SIGTERM)
        sshd.wait(10)
        log.close()


def cluster_config(shipped: dict, *, host: LoopbackHost, name: str, sweeps: Path,
                   worker_ports: int) -> dict:
    """deploy/cluster-cpu.yaml for this machine as its only host (see the module doc)."""
    config = dict(shipped, cluster_name=name, min_workers=0, max_workers=0)
    config["provider"] = {"type": "local", "head_ip": host.address, "worker_ips": []}
    config["auth"] = {"ssh_user": "root", "ssh_private_key": str(host.key)}
    config["file_mounts"] = {**shipped["file_mounts"], "~/gdn-sweep": str(REPO_ROOT),
                             "~/sweeps": str(sweeps)}
    config["setup_commands"] = [
        "python -c 'import service, workers, ray; assert ray.__version__ == \"2.60.0\"'",
        "test -f ~/gdn-sweep/deploy/run_sweep.py && test -s ~/.ray/auth_token",
        *[c for c in shipped["setup_commands"] if "RAY_AUTH_MODE" in c]]
    [start] = [c for c in shipped["head_start_ray_commands"] if "ray start --head" in c]
    assert "--port=6379" in start and "--dashboard-host=0.0.0.0" in start, start
    ports = " ".join(f"--{flag}={free_port()}" for flag in RAY_PORT_FLAGS)
    start = start.replace("--port=6379 ", "").replace("--dashboard-host=0.0.0.0",
                                                      "--dashboard-host=127.0.0.1")
    config["head_start_ray_commands"] = [
        f"{start} {ports} --node-ip-address=127.0.0.1 --num-cpus=2 --disable-usage-stats "
        f"--min-worker-port={worker_ports} --max-worker-port={worker_ports + 63}"]
    config["worker_start_ray_commands"] = []
    return config


def _processes_naming(folder: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE and \
                    str(folder) in " ".join(process.info["cmdline"] or ()):
                found.append(process)
    return found


def _stop_processes_naming(folder: Path) -> None:
    """End what this test's cluster left: its Ray processes (their command lines name the
    session dir under `folder`) and the ssh control masters of its cluster name."""
    processes = _processes_naming(folder)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    _, alive = psutil.wait_procs(alive, timeout=10)
    assert not alive, f"processes of the test's Ray cluster survived: {alive}"


def _ssh_control_dir(cluster_name: str) -> Path:
    """Where Ray's SSH runner keeps its control sockets for `cluster_name` (always /tmp)."""
    user = hashlib.sha256(getuser().encode()).hexdigest()[:10]
    return Path(f"/tmp/ray_ssh_{user}") / hashlib.sha256(cluster_name.encode()).hexdigest()[:10]


def _ray(args: list[str], *, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(["ray", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    print(f"$ ray {' '.join(args[:2])} … ({time.monotonic() - started:.1f} s, "
          f"rc {done.returncode})")
    return done


def _database_rows(db_url: str):
    """Sweeps (id, name, status), trials by status, and succeeded results in the database."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as db:
            sweeps = db.execute(text("SELECT id, name, status FROM sweeps ORDER BY id")).all()
            trials = db.execute(text("SELECT status, count(*) FROM trials GROUP BY status"))
            results = db.execute(text("SELECT count(*) FROM results "
                                      "WHERE status = 'succeeded'")).scalar_one()
            return sweeps, dict(trials.all()), results
    finally:
        engine.dispose()


@pytest.mark.timeout(900)
def test_ray_up_and_ray_submit_write_sweeps_into_postgresql():
    run_sweep = REPO_ROOT / "deploy" / "run_sweep.py"
    assert run_sweep.exists(), "deploy/run_sweep.py is missing"
    from tests.deploy.conftest import WORKER_PORTS, _port_range
    from tests.service.conftest import scratch_postgres_database

    root = Path(tempfile.mkdtemp(prefix="rsub", dir="/tmp"))  # short: Ray's socket paths
    name = f"gdn-e2e-{secrets.token_hex(4)}"
    client_home, workdir = root / "client", root / "elsewhere"
    for folder in (client_home, workdir):
        folder.mkdir()
    (workdir / "sweeps").mkdir()
    (workdir / "sweeps" / "tiny.yaml").write_text(yaml.safe_dump(TINY_SWEEP))
    try:
        with private_sshd(root) as host, \
                scratch_postgres_database("gdn_sweep_ray_submit") as db_url:
            shipped = yaml.safe_load((REPO_ROOT / "deploy" / "cluster-cpu.yaml").read_text())
            config = cluster_config(shipped, host=host, name=name, sweeps=workdir / "sweeps",
                                    worker_ports=_port_range(WORKER_PORTS))
            config_file = workdir / "cluster.yaml"
            config_file.write_text(yaml.safe_dump(config))
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
            env.update(HOME=str(client_home), TMPDIR=str(host.tmp))
            assert not str(workdir).startswith(str(REPO_ROOT))
            token = _ray(["get-auth-token", "--generate"], cwd=workdir, env=env, timeout=60)
            assert token.returncode == 0 and (client_home / ".ray" / "auth_token").exists()

            up = _ray(["up", "-y", "--no-config-cache", str(config_file)], cwd=workdir,
                      env=env, timeout=300)
            assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
            submit = _ray(["submit", str(config_file), str(run_sweep), "--",
                           "~/sweeps/tiny.yaml", "--db", db_url], cwd=workdir, env=env,
                          timeout=600)
            output = submit.stdout + submit.stderr
            assert submit.returncode == 0, output[-6000:]

            sweeps, trials, results = _database_rows(db_url)
            assert [(s.name, s.status) for s in sweeps] == [("ray-submit-e2e", "finished")]
            assert trials == {"succeeded": 2}, output[-4000:]
            assert results == 2
            assert f"sweep {sweeps[0].id} 'ray-submit-e2e'" in output, output[-4000:]
            print(output[-1500:])

            # The same YAML again, into JSON lines on the head (a cluster that cannot reach
            # the database), copied back and imported: a second sweep of its own.
            mkdir = _ray(["exec", str(config_file), "mkdir -p ~/results"], cwd=workdir, env=env,
                         timeout=120)
            assert mkdir.returncode == 0, mkdir.stderr[-2000:]
            again = _ray(["submit", str(config_file), str(run_sweep), "--", "~/sweeps/tiny.yaml",
                          "--jsonl", "~/results/"], cwd=workdir, env=env, timeout=600)
            assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
            down = _ray(["rsync-down", str(config_file), "~/results/", str(workdir / "results")],
                        cwd=workdir, env=env, timeout=120)
            assert down.returncode == 0, down.stderr[-2000:]
            [jsonl] = (workdir / "results").glob("*.jsonl")
            imported = subprocess.run(["gdn-sweep", "import", str(jsonl), "--db", db_url],
                                      cwd=workdir, env=env, capture_output=True, text=True,
                                      timeout=120)
            assert imported.returncode == 0, imported.stderr[-2000:]
            sweeps, trials, results = _database_rows(db_url)
            assert [(s.name, s.status) for s in sweeps] == [("ray-submit-e2e", "finished")] * 2
            assert trials == {"succeeded": 4} and results == 4
            # where to look when it fails (deploy/README.md): the head's Ray logs
            logs = _ray(["exec", str(config_file),
                         "tail -n 5 ${TMPDIR:-/tmp}/ray/session_latest/logs/raylet.out"],
                        cwd=workdir, env=env, timeout=120)
            assert logs.returncode == 0 and "raylet" in logs.stdout.lower(), logs.stderr[-2000:]
            # it ran on the head of this cluster: the start command's resources reached it
            status = _ssh(host, "python -c 'import ray; ray.init(\"auto\"); "
                                "print(ray.cluster_resources().get(\"cpu_chip\"))'", 60)
            assert status.stdout.strip().splitlines()[-1] == "8.0", status.stderr[-2000:]
    finally:
        _stop_processes_naming(root)
        shutil.rmtree(_ssh_control_dir(name), ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
