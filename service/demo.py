"""The README's main command: serve the dashboard and run a small demo sweep on a local Ray.

    python -m service.demo [--port 8000] [--db sqlite:///gdn_sweep.db]

Starts the service (SQLite file, local Ray, the scheduler), submits the demo sweep through
the REST API (tiny preset; jax and torch; all_gather and p2p; chips 1, 2, 4 up to the host's
cores; three sequence lengths), prints the dashboard URL and keeps serving until Ctrl-C.
Running it again resumes an unfinished demo sweep instead of queueing another.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time

from workers import process_probe


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
        "frameworks": ["jax", "torch"], "modes": ["all_gather", "p2p"], "chips": chips,
        "seq_lens": [384, 768, 1536], "model": {"preset": "tiny"}, "batch_size": 1,
        "dtypes": ["float32"], "steps": 3, "warmup_steps": 1,
        "accelerator": {"kind": "cpu", "type": "cpu"}, "trial_timeout_s": 600,
    }


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def submit_demo(base_url: str, *, token: str = "", sweep: dict | None = None) -> int:
    """POST the demo sweep unless an unfinished one is there already; return its id."""
    import httpx

    sweep = sweep or demo_sweep()

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base_url, timeout=30, headers=headers) as client:
        for existing in client.get("/api/sweeps", params={"limit": 50}).json()["data"]:
            if (existing["name"] == sweep["name"]
                    and existing["status"] in ("queued", "running", "cancelling")):
                return existing["id"]
        response = client.post("/api/sweeps", json=sweep)
        response.raise_for_status()
        return response.json()["id"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--db", default=None,
                        help="database URL (default: $DATABASE_URL, else sqlite:///gdn_sweep.db)")
    parser.add_argument("--no-demo-sweep", action="store_true", help="only serve")
    args = parser.parse_args(argv)

    import uvicorn

    from service.core.config import Settings
    from service.main import create_app

    settings = Settings(**({"database_url": args.db} if args.db else {}))
    if not _port_free(args.host, args.port):
        print(f"port {args.port} on {args.host} is taken; pass --port", file=sys.stderr)
        return 1
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=args.host,
                                           port=args.port, log_level="warning"))
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    base_url = f"http://{shown_host}:{args.port}"

    def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.1)
        print(f"\ngdn-sweep is serving: dashboard {base_url}/  API docs {base_url}/docs",
              flush=True)
        if args.no_demo_sweep:
            return
        sweep = demo_sweep()
        try:
            sweep_id = submit_demo(base_url, token=settings.api_token, sweep=sweep)
        except Exception as err:  # noqa: BLE001 - the server keeps running; say what failed
            print(f"could not submit the demo sweep: {err}", file=sys.stderr, flush=True)
            return
        print(f"demo sweep {sweep_id} queued (chips {sweep['chips']} x "
              f"{len(sweep['seq_lens'])} seq_lens x 2 modes x 2 frameworks, one-chip "
              f"baseline once per mode pair); watch it "
              f"fill in at {base_url}/sweeps/{sweep_id}\n(Ray starts on the first sweep; "
              "Ctrl-C stops the service, a restart resumes the sweep)", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        print("stopped; unfinished trials resume on the next start", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
