"""Response bodies of reads that change only with a database counter (models.CacheVersion).

A body is stored under the counter read *before* its query ran, so a write that commits in
between leaves it under an older value than the data it shows: it is never served as newer than
it is. Per process, bounded, least recently used out first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import CacheVersion


def data_version(session: Session, name: str) -> int:
    """The counter `name` as this session sees it now (read it before the query it guards)."""
    return session.scalar(select(CacheVersion.version).where(CacheVersion.name == name))


class ResponseCache:
    """Up to `max_entries` bodies of at most `max_body_bytes` each, keyed by the request (its
    validated parameters) and valid for one counter value. Thread-safe: sync routes run in a
    thread pool."""

    def __init__(self, max_entries: int, max_body_bytes: int = 1 << 20) -> None:
        self.max_entries, self.max_body_bytes = max_entries, max_body_bytes
        self._bodies: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str, version: int) -> bytes | None:
        with self._lock:
            entry = self._bodies.get(key)
            if entry is None or entry[0] != version:
                self.misses += 1
                return None
            self._bodies.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: str, version: int, body: bytes) -> None:
        if self.max_entries == 0 or len(body) > self.max_body_bytes:
            return
        with self._lock:
            current = self._bodies.get(key)
            if current is not None and current[0] > version:
                return  # a request that read a newer counter stored it meanwhile
            self._bodies[key] = (version, body)
            self._bodies.move_to_end(key)
            while len(self._bodies) > self.max_entries:
                self._bodies.popitem(last=False)
