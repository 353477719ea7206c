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

from service.db.models import CacheVersion


def data_version(session: Session, name: str) -> int | None:
    """The counter `name` as this session sees it now (read it before the query it guards);
    None if its row is gone: then no trigger counts and nothing may be cached."""
    return session.scalar(select(CacheVersion.version).where(CacheVersion.name == name))


class ResponseCache:
    """Up to `max_entries` bodies, `max_bytes` in all (a body over a tenth of that is not
    kept), keyed by the request (its validated parameters), each valid for one counter value.
    Thread-safe: sync routes run in a thread pool."""

    def __init__(self, max_entries: int, max_bytes: int = 64 << 20) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._bodies: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def get(self, key: str, version: int | None) -> bytes | None:
        with self._lock:
            entry = self._bodies.get(key)
            if entry is None or version is None or entry[0] != version:
                self.misses += 1
                return None
            self._bodies.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, key: str, version: int | None, body: bytes) -> None:
        if version is None or not self.enabled or len(body) > self.max_bytes // 10:
            return
        with self._lock:
            current = self._bodies.pop(key, None)
            if current is not None:
                if current[0] > version:  # a request that read a newer counter stored it
                    self._bodies[key] = current
                    return
                self._bytes -= len(current[1])
            self._bodies[key] = (version, body)
            self._bytes += len(body)
            while len(self._bodies) > self.max_entries or self._bytes > self.max_bytes:
                self._bytes -= len(self._bodies.popitem(last=False)[1][1])
