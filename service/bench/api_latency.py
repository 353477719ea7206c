"""`gdn-sweep bench api` without --concurrency: latency of the read API, one request at a time.

Fills a fresh SQLite file and a fresh PostgreSQL database with synthetic sweeps
(synthetic_db.py), serves them with a real `gdn-sweep serve` on loopback (serve_process.py:
the service's own app factory and process; no scheduler, the results cache off, so what is
timed is the queries), and times GET /api/results with filters and GET /api/sweeps/{id} one
request at a time (keep-alive). Prints p50/p99 per query and backend; the goal is p99 < 50 ms.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from gdn_core.cp_modes import CP_MODES
from gdn_core.presets import PRESETS
from gdn_core.train_config import FRAMEWORKS
from service.bench.serve_process import REPO_ROOT, ServeProcess
from service.bench.synthetic_db import ACCELERATORS, CHIPS, SEQ_LENS, ScratchDatabase, fill
from service.db.engine import upgrade_database

GOAL_MS = 50.0


def _queries(rng: random.Random, sweep_ids: list[int]) -> dict[str, callable]:
    presets = sorted(PRESETS)

    def narrow():
        n = rng.randrange(len(sweep_ids))
        lo = rng.choice(SEQ_LENS[:-3])
        return "/api/results", {
            "preset": presets[n % len(presets)], "accelerator": ACCELERATORS[n % 5][1],
            "mode": rng.choice(CP_MODES), "chips": rng.choice(CHIPS), "seq_len_min": lo,
            "seq_len_max": lo * 8, "dtype": "bfloat16", "sort": "-tokens_per_s_per_chip"}

    def broad():
        n = rng.randrange(len(sweep_ids))
        return "/api/results", {"preset": presets[n % len(presets)],
                                "accelerator": ACCELERATORS[n % 5][1],
                                "sort": "-tokens_per_s_per_chip", "limit": 100}

    def framework_mode():
        return "/api/results", {"framework": rng.choice(FRAMEWORKS), "mode": rng.choice(CP_MODES),
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
    """p50, p99 (ms) and rows returned per query, over HTTP against `gdn-sweep serve`."""
    # kept afterwards: a serve that fails to start is named with its log
    log = Path(tempfile.mkdtemp(prefix="gdn-sweep-bench-latency-")) / "serve.log"
    serve = ServeProcess(REPO_ROOT, url, ["--no-access-log"], log, {
        "GDN_SWEEP_RUN_SCHEDULER": "false",  # no Ray: a read API over a filled database
        "GDN_SWEEP_RESULTS_CACHE_ENTRIES": "0"})  # the queries' latency, not the cache's
    try:
        serve.wait_ready()
        return _time_queries(f"http://127.0.0.1:{serve.port}", sweep_ids, requests, seed)
    finally:
        serve.stop()


def _time_queries(base_url: str, sweep_ids: list[int], requests: int,
                  seed: int) -> dict[str, tuple]:
    import httpx

    rng, out = random.Random(seed), {}
    with httpx.Client(base_url=base_url, timeout=30) as client:
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
    return out


def latency_main(args) -> int:
    """Measure every backend of `args.backends` and print the table (the CLI's default)."""
    table = []
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with ScratchDatabase(backend, args.postgres_url) as url:
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
