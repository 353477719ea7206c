"""`gdn-sweep bench api`: latency of the read API over a database of 100,000 trials.

Fills a fresh SQLite file and a fresh PostgreSQL database (created and dropped here) with
synthetic sweeps, serves the real app with uvicorn on loopback, and times GET /api/results
with filters and GET /api/sweeps/{id} from an HTTP client (keep-alive). Prints p50/p99 per
query and backend; the goal is p99 < 50 ms.

    gdn-sweep bench api [--rows 100000] [--requests 300] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import itertools
import random
import secrets
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import insert, text
from sqlalchemy.engine import make_url

from gdn_core.presets import PRESETS
from workers.spec import trial_key

from .core.config import Settings
from .core.db import make_engine, upgrade_database
from .models import FACT_COLUMNS, Result, Sweep, Trial, TrialAttempt, utcnow

FRAMEWORKS, MODES = ("jax", "torch"), ("ulysses", "p2p", "all_gather", "log_scan")
CHIPS = (1, 2, 4, 8, 16, 32, 64, 128)
SEQ_LENS = tuple(2 ** k for k in range(10, 21))
ACCELERATORS = (("cpu", "cpu"), ("gpu", "h100"), ("tpu", "v5p"), ("tpu", "v6e"), ("gpu", "a100"))
GOAL_MS = 50.0


def _status(rng: random.Random, chips: int, seq_len: int) -> str:
    if seq_len // chips > 2 ** 18 and rng.random() < 0.7:
        return "oom"
    return rng.choices(("succeeded", "failed", "timeout", "skipped"), (90, 5, 2, 3))[0]


def fill(url: str, rows: int, seed: int = 0) -> list[int]:
    """Insert synthetic sweeps of len(grid) trials each until `rows` trials; return sweep ids."""
    rng = random.Random(seed)
    presets = sorted(PRESETS)
    engine = make_engine(url)
    now, sweep_ids, trial_id = utcnow(), [], 0
    with engine.begin() as conn:
        for n in itertools.count():
            if trial_id >= rows:
                break
            preset, (kind, chip) = presets[n % len(presets)], ACCELERATORS[n % len(ACCELERATORS)]
            dtype = "bfloat16" if n % 3 else "float32"
            frameworks = ("jax",) if kind == "tpu" else FRAMEWORKS  # no torch-on-TPU path
            grid = list(itertools.product(frameworks, MODES, CHIPS, SEQ_LENS))
            spec = {"name": f"bench {n}", "frameworks": list(frameworks), "modes": list(MODES),
                    "chips": list(CHIPS), "seq_lens": list(SEQ_LENS), "model": {"preset": preset},
                    "dtypes": [dtype], "accelerator": {"kind": kind, "type": chip}}
            sweep_id = conn.execute(insert(Sweep).returning(Sweep.id), [{
                "name": spec["name"], "status": "finished", "spec": spec,
                "trials_total": len(grid), "trials_skipped": 0, "created_at": now}]).scalar_one()
            sweep_ids.append(sweep_id)
            trials, results, attempts = [], [], []
            for framework, mode, chips, seq_len in grid[:rows - trial_id]:
                trial_id += 1
                status = _status(rng, chips, seq_len)
                point = dict(framework=framework, mode=mode, seq_len=seq_len, dtype=dtype,
                             param_sharding="replicated", remat="none")
                trials.append(dict(
                    id=trial_id, sweep_id=sweep_id, key=trial_key(chips=chips, **point),
                    # chips=1 once per mode (one_chip_baseline false): each mode's own baseline
                    baseline_key=trial_key(chips=1, **point) if chips > 1 else None, repeat=0,
                    framework=framework, mode=mode, chips=chips, seq_len=seq_len, batch_size=1,
                    preset=preset, num_layers=8, vocab_size=1024, dtype=dtype,
                    param_sharding="replicated", remat="none", steps=3, warmup_steps=1,
                    accelerator_kind=kind,
                    accelerator_type=chip, verify=False, timeout_s=600.0, skip_reason=None,
                    status=status, created_at=now, started_at=now))
                ok = status == "succeeded"
                step = seq_len / chips * 1e-5 * rng.uniform(0.8, 1.25)
                results.append(dict(
                    {k: trials[-1][k] for k in FACT_COLUMNS}, trial_id=trial_id,
                    status=status, error=None if ok else "synthetic",
                    attempts=1, hosts=["bench-host"], versions={"torch": "2.13.0"},
                    started_at=now, finished_at=now, step_time_s=step if ok else None,
                    step_time_min_s=step * 0.95 if ok else None,
                    step_time_max_s=step * 1.1 if ok else None, measured_steps=3 if ok else None,
                    tokens_per_s_per_chip=seq_len / step / chips if ok else None,
                    mfu=rng.uniform(0.05, 0.6) if ok else None,
                    peak_memory_bytes_per_chip=seq_len // chips * 4096,
                    memory_source="synthetic"))
                attempts.append(dict(trial_id=trial_id, attempt=1, status=status,
                                     reason=None if ok else "synthetic", hosts=["bench-host"],
                                     started_at=now, finished_at=now))
            conn.execute(insert(Trial), trials)
            conn.execute(insert(Result), results)
            conn.execute(insert(TrialAttempt), attempts)
    engine.dispose()
    # What autovacuum (PostgreSQL) and `PRAGMA optimize` (SQLite) do in production: planner
    # statistics, and on PostgreSQL the visibility map that lets COUNT(*) read indexes only.
    engine = make_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE" if engine.dialect.name == "sqlite" else "VACUUM ANALYZE"))
    engine.dispose()
    return sweep_ids


def _queries(rng: random.Random, sweep_ids: list[int]) -> dict[str, callable]:
    presets = sorted(PRESETS)

    def narrow():
        n = rng.randrange(len(sweep_ids))
        lo = rng.choice(SEQ_LENS[:-3])
        return "/api/results", {
            "preset": presets[n % len(presets)], "accelerator": ACCELERATORS[n % 5][1],
            "mode": rng.choice(MODES), "chips": rng.choice(CHIPS), "seq_len_min": lo,
            "seq_len_max": lo * 8, "dtype": "bfloat16", "sort": "-tokens_per_s_per_chip"}

    def broad():
        n = rng.randrange(len(sweep_ids))
        return "/api/results", {"preset": presets[n % len(presets)],
                                "accelerator": ACCELERATORS[n % 5][1],
                                "sort": "-tokens_per_s_per_chip", "limit": 100}

    def framework_mode():
        return "/api/results", {"framework": rng.choice(FRAMEWORKS), "mode": rng.choice(MODES),
                                "sort": "-mfu", "limit": 100}

    def unfiltered():
        return "/api/results", {"sort": "-tokens_per_s_per_chip", "limit": 100}

    def sweep():
        return f"/api/sweeps/{rng.choice(sweep_ids)}", {}

    return {"results: preset+accelerator+mode+chips+seq_len range+dtype": narrow,
            "results: preset+accelerator, top 100 by tokens/s/chip": broad,
            "results: framework+mode, top 100 by mfu": framework_mode,
            "results: no filter, top 100 by tokens/s/chip": unfiltered,
            "sweeps/{id} (352 or 704 trials, counts per status)": sweep}


def measure(url: str, sweep_ids: list[int], requests: int, seed: int = 1) -> dict[str, tuple]:
    """p50, p99 (ms) and rows returned per query, over HTTP against the real app."""
    import httpx
    import uvicorn

    from .main import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(Settings(database_url=url, run_scheduler=False, upgrade_on_start=False))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    rng, out = random.Random(seed), {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for name, make in _queries(rng, sweep_ids).items():
                times, sizes = [], []
                for i in range(requests + requests // 10):  # the first tenth warms up
                    path, params = make()
                    start = time.perf_counter()
                    response = client.get(path, params=params)
                    elapsed = time.perf_counter() - start
                    response.raise_for_status()
                    if i >= requests // 10:
                        times.append(elapsed * 1000)
                        body = response.json()
                        sizes.append(body.get("count", body.get("trials_total", 0)))
                q = statistics.quantiles(times, n=100, method="inclusive")
                out[name] = (q[49], q[98], statistics.median(sizes))
    finally:
        server.should_exit = True
        thread.join(30)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gdn-sweep bench api", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="trial rows to create")
    parser.add_argument("--requests", type=int, default=300, help="timed requests per query")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/"
                        "postgres", help="a server where a scratch database may be created")
    args = parser.parse_args(argv)
    table = []
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with _database(backend, args.postgres_url) as url:
            start = time.perf_counter()
            upgrade_database(url)
            sweep_ids = fill(url, args.rows)
            print(f"{backend}: {args.rows} trials in {len(sweep_ids)} sweeps loaded in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
            for name, (p50, p99, rows) in measure(url, sweep_ids, args.requests).items():
                table.append((backend, name, p50, p99, rows))
    print(f"\n| backend | query | p50 ms | p99 ms | matching rows (median) "
          f"| p99 < {GOAL_MS:g} ms |")
    print("|---|---|---:|---:|---:|---|")
    for backend, name, p50, p99, rows in table:
        print(f"| {backend} | {name} | {p50:.1f} | {p99:.1f} | {rows:g} | "
              f"{'yes' if p99 < GOAL_MS else 'NO'} |")
    return 0


class _database:
    """A scratch database of `backend`, removed afterwards."""

    def __init__(self, backend: str, postgres_url: str) -> None:
        if backend not in ("sqlite", "postgresql"):
            raise SystemExit(f"--backends: {backend!r} is not one of: sqlite, postgresql")
        self.backend, self.admin = backend, make_url(postgres_url).set(
            drivername="postgresql+psycopg")

    def __enter__(self) -> str:
        if self.backend == "sqlite":
            self.tmp = tempfile.TemporaryDirectory(prefix="gdn-sweep-bench-")
            return f"sqlite:///{Path(self.tmp.name) / 'bench.db'}"
        self.name = f"gdn_sweep_bench_{secrets.token_hex(4)}"
        self._admin_exec(f'CREATE DATABASE "{self.name}"')
        return self.admin.set(database=self.name).render_as_string(hide_password=False)

    def __exit__(self, *exc) -> None:
        if self.backend == "sqlite":
            self.tmp.cleanup()
        else:
            self._admin_exec(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _admin_exec(self, sql: str) -> None:
        engine = make_engine(self.admin.render_as_string(hide_password=False),
                             isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(sql))
        engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
