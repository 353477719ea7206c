"""`gdn-sweep bench api`: load on the read API over a database of 100,000 trials.

Latency (the default, api_latency.py): fills a fresh SQLite file and a fresh PostgreSQL
database (created and dropped here) with synthetic sweeps, serves them with a real `gdn-sweep
serve` on loopback (no scheduler, results cache off), and times GET /api/results with filters
and GET /api/sweeps/{id} one request at a time (keep-alive). Prints p50/p99 per query and
backend; the goal is p99 < 50 ms. Both modes serve through serve_process.py.

    gdn-sweep bench api [--rows 100000] [--requests 300] [--backends sqlite,postgresql]

Load (`--concurrency`): a real `gdn-sweep serve` process (its scheduler and local Ray
included) on PostgreSQL with 100,000 results, and closed-loop clients: each sends its next
request when the last one returns, half `GET /api/results?limit=50` with filters, half
`GET /api/sweeps/{id}`, for `--duration-s` at each concurrency. Prints req/s, p50, p99, max,
the status counts, and the serve process's CPU per request (its Ray excluded), per
`--workers` value; `--uncached` adds each with the results cache off; `--baseline DIR` adds
the same run of another checkout's serve (e.g. `git archive HEAD | tar -x -C DIR`), side by
side. The results queries repeat (a few dozen distinct filter sets, as dashboards repeat
theirs): with the cache on, all but the first of each are served from it.

    gdn-sweep bench api --concurrency 50,500 --duration-s 30 --workers 1,2 --uncached \
        [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from gdn_core.cp_modes import CP_MODES
from gdn_core.presets import PRESETS
from service.bench.serve_process import REPO_ROOT, ServeProcess, cpu_seconds, psutil_module
from service.bench.synthetic_db import ACCELERATORS, ScratchDatabase, ensure_filled
from service.core.config import Settings


def main(argv: list[str] | None = None) -> int:
    """`gdn-sweep bench api [options]`: the latency benchmark, or with --concurrency the load
    benchmark."""
    parser = argparse.ArgumentParser(prog="gdn-sweep bench api", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="trial rows to create")
    parser.add_argument("--requests", type=int, default=300, help="timed requests per query")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/"
                        "postgres", help="a server where a scratch database may be created")
    load = parser.add_argument_group("load (closed-loop clients against `gdn-sweep serve`)")
    load.add_argument("--concurrency", type=_int_list, default=None,
                      help="clients at once, comma-separated (e.g. 50,500): run the load "
                           "benchmark, on PostgreSQL")
    load.add_argument("--duration-s", type=float, default=30.0, help="per concurrency")
    load.add_argument("--workers", type=_int_list, default=[1],
                      help="serve --workers values to compare (default 1)")
    load.add_argument("--baseline", metavar="DIR", default=None,
                      help="also run the serve of this checkout (1 worker, its defaults)")
    load.add_argument("--uncached", action="store_true",
                      help="also run each --workers value with the results cache off "
                           "(GDN_SWEEP_RESULTS_CACHE_ENTRIES=0): every query computed")
    load.add_argument("--client-processes", type=int, default=2,
                      help="processes the clients are spread over (default 2)")
    load.add_argument("--database-url", default=None,
                      help="an already filled database to reuse (default: a scratch one)")
    args = parser.parse_args(argv)
    if args.concurrency:
        return load_main(args)
    from service.bench.api_latency import latency_main

    return latency_main(args)


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


# --- load: closed-loop clients against a real `gdn-sweep serve` -------------------------------

def load_request(rng: random.Random, sweep_ids: list[int]) -> str:
    """One request of the mix: results with filters (a page of 50), or one sweep."""
    if rng.random() < 0.5:
        return f"/api/sweeps/{rng.choice(sweep_ids)}"
    n = rng.randrange(len(sweep_ids))
    presets = sorted(PRESETS)
    return "/api/results?" + urlencode({
        "preset": presets[n % len(presets)], "accelerator": ACCELERATORS[n % 5][1],
        "mode": rng.choice(CP_MODES), "dtype": "bfloat16", "sort": "-tokens_per_s_per_chip",
        "limit": 50})


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """(status, keep-alive) of one HTTP/1.1 response, its body read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    headers = {k.strip().lower(): v.strip().lower() for k, v in headers.items()}
    if headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
    else:
        await reader.readexactly(int(headers.get("content-length", 0)))
    return status, headers.get("connection") != "close"


async def _client(port: int, rng: random.Random, sweep_ids: list[int], start_at: float,
                  end_at: float, out: list, statuses: collections.Counter) -> None:
    """One client: a keep-alive connection, a request as soon as the last one returned."""
    reader = writer = None
    while time.time() < end_at:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            path = load_request(rng, sweep_ids)
            sent = time.time()
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            try:
                status, keep_alive = await asyncio.wait_for(_read_response(reader),
                                                            max(0.1, end_at + 1 - sent))
            except TimeoutError:  # still waiting when the window closed: counted apart
                if sent >= start_at:
                    statuses["unfinished"] += 1
                break
            done = time.time()
            if sent >= start_at and done <= end_at:  # the warm-up and the tail do not count
                out.append((path.startswith("/api/results"), done - sent))
                statuses[str(status)] += 1
            if not keep_alive:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            if time.time() >= start_at:
                statuses[type(err).__name__] += 1
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


def _client_process(port: int, clients: int, seed: int, sweep_ids: list[int], window,
                    ready, go, queue) -> None:
    async def run() -> tuple[list, collections.Counter]:
        latencies, statuses = [], collections.Counter()
        rng = random.Random(seed)
        await asyncio.gather(*(
            _client(port, random.Random(rng.random()), sweep_ids, window[0], window[1],
                    latencies, statuses) for _ in range(clients)))
        return latencies, statuses

    ready.put(os.getpid())
    go.wait()
    queue.put(asyncio.run(run()))


def run_load(port: int, concurrency: int, duration_s: float, sweep_ids: list[int], *,
             processes: int = 2, warmup_s: float = 3.0, seed: int = 7,
             measured_pids: list[int] = ()) -> dict:
    """Closed-loop clients against 127.0.0.1:port: req/s, p50/p99/max (ms), status counts,
    and the CPU the `measured_pids` spent per request. The clients start together, warm up
    for `warmup_s`, then count what completes within `duration_s`."""
    psutil = psutil_module()
    ctx = multiprocessing.get_context("spawn")
    ready, go, queue = ctx.Queue(), ctx.Event(), ctx.Queue()
    window = ctx.Array("d", 2)
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    workers = [ctx.Process(target=_client_process, daemon=True, args=(
        port, n, seed + i, sweep_ids, window, ready, go, queue)) for i, n in enumerate(shares)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    start_at = time.time() + warmup_s
    end_at = window[1] = start_at + duration_s
    window[0] = start_at
    go.set()
    measured = [psutil.Process(pid) for pid in measured_pids]
    time.sleep(max(0.0, start_at - time.time()))
    cpu_before = cpu_seconds(measured)
    time.sleep(max(0.0, end_at - time.time()))
    cpu_after = cpu_seconds(measured)
    latencies, statuses = [], collections.Counter()
    for _ in workers:
        got_latencies, got_statuses = queue.get(timeout=300)
        latencies += got_latencies
        statuses.update(got_statuses)
    for worker in workers:
        worker.join(30)
    every = sorted(seconds for _, seconds in latencies)
    results = sorted(seconds for is_results, seconds in latencies if is_results)
    sweeps = sorted(seconds for is_results, seconds in latencies if not is_results)

    def pct(sample: list[float], q: float) -> float:
        return sample[min(len(sample) - 1, int(q * len(sample)))] * 1000 if sample else float("nan")

    return {"concurrency": concurrency, "requests": len(latencies),
            "rps": len(latencies) / duration_s,
            "p50": pct(every, 0.50), "p99": pct(every, 0.99),
            "max": every[-1] * 1000 if every else float("nan"),
            "p99_results": pct(results, 0.99), "p99_sweep": pct(sweeps, 0.99),
            "statuses": dict(sorted(statuses.items())),
            "cpu_ms_per_request": ((cpu_after - cpu_before) * 1000 / len(latencies)
                                   if latencies else float("nan"))}


def load_main(args) -> int:
    """The load benchmark of `args` (--concurrency given), one table row per serve and
    concurrency."""
    variants = [(f"this checkout, --workers {n}", REPO_ROOT,
                 [] if n == 1 else ["--workers", str(n)], {}) for n in args.workers]
    if args.uncached:
        variants += [(f"{label}, results cache off", checkout, serve_args,
                      {"GDN_SWEEP_RESULTS_CACHE_ENTRIES": "0"})
                     for label, checkout, serve_args, _ in variants]
    if args.baseline:
        variants.insert(0, (f"baseline {args.baseline}", Path(args.baseline).resolve(), [], {}))
    rows = []
    with (contextlib.nullcontext(Settings(database_url=args.database_url).database_url)
          if args.database_url else ScratchDatabase("postgresql", args.postgres_url)) as url:
        sweep_ids = ensure_filled(url, args.rows)
        logs = Path(tempfile.mkdtemp(prefix="gdn-sweep-bench-load-"))
        for i, (label, checkout, serve_args, env) in enumerate(variants):
            serve = ServeProcess(checkout, url, serve_args, logs / f"serve-{i}.log", env)
            try:
                serve.wait_ready()
                print(f"{label}: serving on port {serve.port} (log {serve.log.name})",
                      flush=True)
                for concurrency in args.concurrency:
                    row = run_load(serve.port, concurrency, args.duration_s, sweep_ids,
                                   processes=args.client_processes,
                                   measured_pids=serve.api_pids())
                    rows.append((label, row))
                    print(f"  {concurrency} clients: {row['rps']:.0f} req/s, p50 "
                          f"{row['p50']:.0f} ms, p99 {row['p99']:.0f} ms", flush=True)
            finally:
                serve.stop()
    print(f"\nPostgreSQL, {args.rows} results; closed-loop clients, {args.duration_s:g} s each; "
          f"half GET /api/results?limit=50 with filters, half GET /api/sweeps/{{id}}\n")
    print("| serve | clients | req/s | p50 ms | p99 ms | max ms | p99 results / sweep ms "
          "| statuses | API CPU ms/req |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for label, row in rows:
        shown = " ".join(f"{k}:{v}" for k, v in row["statuses"].items())
        print(f"| {label} | {row['concurrency']} | {row['rps']:.0f} | {row['p50']:.0f} | "
              f"{row['p99']:.0f} | {row['max']:.0f} | "
              f"{row['p99_results']:.0f} / {row['p99_sweep']:.0f} | {shown} | "
              f"{row['cpu_ms_per_request']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
