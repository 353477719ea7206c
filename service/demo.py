"""The README's main command: serve the dashboard and run a small demo sweep on a local Ray.

    python -m service.demo [--port 8000] [--db sqlite:///gdn_sweep.db]
    python -m service.demo --smoke          # a 4-trial sweep that must succeed, then a clean stop

Starts the service (SQLite file, local Ray, the scheduler), submits the demo sweep through
the REST API (tiny preset; jax and torch; all_gather and p2p; chips 1, 2, 4 up to the host's
cores; three sequence lengths), prints the dashboard URL, prints one line with the URL of the
sweep's results page when the sweep finishes, and keeps serving until Ctrl-C.
Running it again resumes an unfinished demo sweep instead of queueing another. A demo sweep the
service does not accept stops the service with exit status 1.

`--smoke` is the main command end to end in a few minutes (CI runs it in a venv holding the
runtime dependencies alone): the service on a fresh SQLite file, a sweep of at most four trials
(one per framework on one chip and on two, where the host has two cores), every trial
`succeeded` or exit 1, then the service stops as Ctrl-C would stop it.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from gdn_core.train_config import FRAMEWORKS
from workers import process_probe

POLL_S = 2.0
FINAL_SWEEP_STATUSES = ("finished", "cancelled", "failed")


def demo_sweep(cores: int | None = None) -> dict:
    """The demo grid, sized to the host: chip counts 1, 2, 4 up to its usable cores (a virtual
    CPU chip is a real partition of cores, so a 2-core host runs 1 and 2 chips). Every seq_len
    splits evenly over those chips into whole chunks of 16 tokens. The one-chip baseline runs
    once per (framework, seq_len), so on 2 cores: 2 x 3 baselines + 2 x 2 modes x 3 = 18 trials.
    """
    cores = cores or process_probe.host_cpu_count()
    chips = [c for c in (1, 2, 4) if c <= cores]
    return {
        "name": f"demo: tiny model, all_gather vs p2p, {chips[0]}-{chips[-1]} chips",
        "frameworks": list(FRAMEWORKS), "modes": ["all_gather", "p2p"], "chips": chips,
        "seq_lens": [384, 768, 1536], "model": {"preset": "tiny"}, "batch_size": 1,
        "dtypes": ["float32"], "steps": 3, "warmup_steps": 1,
        "accelerator": {"kind": "cpu", "type": "cpu"}, "trial_timeout_s": 600,
    }


def smoke_sweep(cores: int | None = None) -> dict:
    """The smoke grid: both frameworks on one chip and, with two cores, on two (all_gather):
    4 trials on 2 cores, each seconds of stepping after its compile."""
    cores = cores or process_probe.host_cpu_count()
    return {
        "name": "smoke: tiny model, 1 layer", "frameworks": list(FRAMEWORKS),
        "modes": ["all_gather"], "chips": [1, 2] if cores >= 2 else [1], "seq_lens": [256],
        "model": {"preset": "tiny", "num_layers": 1}, "batch_size": 1, "dtypes": ["float32"],
        "steps": 2, "warmup_steps": 1, "accelerator": {"kind": "cpu", "type": "cpu"},
        "trial_timeout_s": 300,
    }


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def submit_demo(client: httpx.Client, sweep: dict) -> int:
    """POST `sweep` unless an unfinished sweep of its name is there already; return its id.
    A refusal raises httpx.HTTPStatusError carrying the service's reason."""
    for existing in client.get("/api/sweeps", params={"limit": 50}).raise_for_status().json()[
            "data"]:
        if (existing["name"] == sweep["name"]
                and existing["status"] in ("queued", "running", "cancelling")):
            return existing["id"]
    response = client.post("/api/sweeps", json=sweep)
    if response.is_error:
        raise httpx.HTTPStatusError(f"{response.status_code} {response.text[:500]}",
                                    request=response.request, response=response)
    return response.json()["id"]


def wait_for_sweep(client: httpx.Client, sweep_id: int, *, timeout_s: float,
                   out=sys.stdout) -> dict:
    """Poll the sweep until its status is final (or `timeout_s` passes); return its last view,
    printing each change of its trial counts."""
    deadline = time.monotonic() + timeout_s
    shown = None
    while True:
        sweep = client.get(f"/api/sweeps/{sweep_id}").raise_for_status().json()
        counts = {status: n for status, n in sweep["counts"].items() if n}
        if counts != shown:
            print(f"sweep {sweep_id} {sweep['status']}: {counts}", file=out, flush=True)
            shown = counts
        if sweep["status"] in FINAL_SWEEP_STATUSES or time.monotonic() > deadline:
            return sweep
        time.sleep(POLL_S)


def finish_line(sweep: dict, base_url: str) -> str:
    """What the demo prints when its sweep ends: how its trials ended and where to read them."""
    counts = {status: n for status, n in sweep["counts"].items() if n}
    others = ", ".join(f"{n} {status}" for status, n in counts.items() if status != "succeeded")
    return (f"sweep {sweep['id']} {sweep['status']}: {counts.get('succeeded', 0)} of "
            f"{sweep['trials_total']} trials succeeded{f' ({others})' if others else ''}; "
            f"results: {base_url}/sweeps/{sweep['id']} (table: "
            f"{base_url}/results?sweep_id={sweep['id']})")


def follow_demo(client: httpx.Client, server, base_url: str, sweep_id: int,
                out=sys.stdout) -> dict | None:
    """Wait quietly for the sweep to end (the dashboard shows it live), then print its
    finish_line; return its last view. None when the service stops first (Ctrl-C), or the sweep
    can no longer be read (then a line says so; the service serves on)."""
    while not server.should_exit:
        try:
            sweep = client.get(f"/api/sweeps/{sweep_id}").raise_for_status().json()
        except httpx.TransportError:  # a busy or stopping service: ask again
            time.sleep(POLL_S)
            continue
        except httpx.HTTPStatusError as err:
            print(f"the demo stopped following sweep {sweep_id}: {err}", file=out, flush=True)
            return None
        if sweep["status"] in FINAL_SWEEP_STATUSES:
            print(finish_line(sweep, base_url), file=out, flush=True)
            return sweep
        time.sleep(POLL_S)
    return None


def smoke_verdict(sweep: dict) -> str | None:
    """Why a smoke sweep did not pass (None when it finished with every trial succeeded)."""
    not_succeeded = {status: n for status, n in sweep["counts"].items()
                     if n and status != "succeeded"}
    if sweep["status"] != "finished" or not_succeeded:
        return (f"sweep {sweep['id']} ended {sweep['status']} with "
                f"{sweep['counts'].get('succeeded', 0)}/{sweep['trials_total']} trials "
                f"succeeded (other statuses: {not_succeeded})")
    return None


def _serve_and_submit(server, base_url: str, token: str, sweep: dict, *, smoke: bool,
                      timeout_s: float, outcome: dict) -> None:
    """Runs beside the server: submit `sweep` once the server is up; stop the server with
    exit 1 if it is refused, or if anything here fails (a closed stdout, say: the service
    must not go on serving with no sweep and nobody told), and (smoke) once the sweep is
    final."""
    try:
        _submit_when_up(server, base_url, token, sweep, smoke=smoke, timeout_s=timeout_s,
                        outcome=outcome)
    except BaseException:
        outcome["exit"] = 1
        server.should_exit = True
        raise  # the thread's traceback goes to stderr (threading.excepthook)


def _submit_when_up(server, base_url: str, token: str, sweep: dict, *, smoke: bool,
                    timeout_s: float, outcome: dict) -> None:
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.1)
    print(f"\ngdn-sweep is serving: dashboard {base_url}/  API docs {base_url}/docs",
          flush=True)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=base_url, timeout=30, headers=headers) as client:
            sweep_id = submit_demo(client, sweep)
            print(f"sweep {sweep_id} queued ({sweep['name']}); watch it fill in at "
                  f"{base_url}/sweeps/{sweep_id}", flush=True)
            if not smoke:
                print("(Ray starts on the first sweep; Ctrl-C stops the service, a restart "
                      "resumes the sweep; a line here says when it has finished)", flush=True)
                follow_demo(client, server, base_url, sweep_id)
                return
            ended = wait_for_sweep(client, sweep_id, timeout_s=timeout_s)
            print(finish_line(ended, base_url), flush=True)
            problem = smoke_verdict(ended)
    except httpx.HTTPError as err:
        problem = f"could not submit or follow the sweep: {err}"
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        outcome["exit"] = 1
    else:
        print("smoke passed: every trial succeeded; stopping the service", flush=True)
    server.should_exit = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=None,
                        help="default 8000 (--smoke: a free port)")
    parser.add_argument("--db", default=None,
                        help="database URL (default: $DATABASE_URL, else sqlite:///gdn_sweep.db; "
                             "--smoke: a new SQLite file in a temporary folder)")
    parser.add_argument("--no-demo-sweep", action="store_true", help="only serve")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve beyond loopback without GDN_SWEEP_API_TOKEN, on purpose")
    parser.add_argument("--smoke", action="store_true",
                        help="run a 4-trial sweep that must succeed, then stop (exit 0 or 1)")
    parser.add_argument("--smoke-timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)

    import uvicorn

    from service.core.config import Settings
    from service.core.exposure import refusal_to_serve
    from service.main import create_app

    with tempfile.TemporaryDirectory(prefix="gdn-sweep-smoke-") as scratch:
        db = args.db or (f"sqlite:///{Path(scratch) / 'smoke.db'}" if args.smoke else None)
        settings = Settings(served_host=args.host,
                            allow_unauthenticated=args.allow_unauthenticated,
                            **({"database_url": db} if db else {}))
        if settings.open_to_network and not settings.allow_unauthenticated:
            print(f"python -m service.demo: {refusal_to_serve(args.host)}", file=sys.stderr)
            return 2
        port = args.port or (_free_port(args.host) if args.smoke else 8000)
        if not _port_free(args.host, port):
            print(f"port {port} on {args.host} is taken; pass --port", file=sys.stderr)
            return 1
        server = uvicorn.Server(uvicorn.Config(create_app(settings), host=args.host, port=port,
                                               log_level="warning"))
        shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        outcome = {"exit": 0}
        if not args.no_demo_sweep:
            sweep = smoke_sweep() if args.smoke else demo_sweep()
            threading.Thread(target=_serve_and_submit, daemon=True, kwargs=dict(
                server=server, base_url=f"http://{shown_host}:{port}",
                token=settings.api_token, sweep=sweep, smoke=args.smoke,
                timeout_s=args.smoke_timeout_s, outcome=outcome)).start()
        try:
            server.run()
        except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
            print("stopped; unfinished trials resume on the next start", file=sys.stderr)
            return 130
        if not server.started:
            return 1  # uvicorn said why (the app's startup failed)
        return outcome["exit"]


if __name__ == "__main__":
    raise SystemExit(main())
