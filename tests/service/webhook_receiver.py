"""A real local HTTP server standing in for a schedule's webhook: it records every POST (its
JSON body and headers) and answers each with the next status of a script (default 204)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.posts: list[dict] = []
        self.lock = threading.Lock()
        self.url = ""

    def wait_for(self, count: int, timeout_s: float) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.posts) >= count:
                    return list(self.posts)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.posts)} POST(s) after {timeout_s} s, not {count}")


@contextmanager
def webhook_receiver(statuses: list[int] = ()) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port) answering `statuses` in turn, then 204."""
    receiver = Receiver(statuses)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with receiver.lock:
                receiver.posts.append({"body": json.loads(body), "headers": dict(self.headers)})
                status = receiver.statuses.pop(0) if receiver.statuses else 204
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gdn"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
