"""The service's connection to Ray: a local Ray when RAY_ADDRESS is empty, else that cluster.

Connecting is the workers' `connect_ray`: a local Ray advertises GDN_SWEEP_CPU_CHIPS virtual
CPU chips (default 8); a secured remote cluster needs RAY_AUTH_MODE=token and its token (see
workers/cluster.py).
"""

from __future__ import annotations

import logging
import threading

from workers.cluster import connect_ray

log = logging.getLogger(__name__)


class RayConnection:
    """Connect once (the scheduler does at start; retried while sweeps wait), remember the
    last error for /api/health."""

    def __init__(self, address: str, *, cpu_chips: int | None = None) -> None:
        self.address = address
        self.cpu_chips = cpu_chips
        self.error: str | None = None
        self.started_here = False
        self._lock = threading.Lock()

    def ensure(self) -> bool:
        """Connect if not connected yet; False (and `error` set) when Ray is unreachable."""
        import ray

        with self._lock:
            if ray.is_initialized():
                return True
            try:
                info = connect_ray(self.address, cpu_chips=self.cpu_chips)
            except Exception as err:  # noqa: BLE001 - reported through health
                self.error = f"{type(err).__name__}: {err}"
                log.error("cannot reach Ray at %r: %s", self.address or "(local)", self.error)
                return False
            self.error, self.started_here = None, info.started_locally
            return True

    def health(self) -> tuple[bool | None, str]:
        """(ok, detail): ok None while nothing asked this process to connect yet."""
        import ray

        if not ray.is_initialized():
            if self.error:
                return False, self.error
            return None, "connecting (a local Ray takes a few seconds to start)"
        try:
            resources = ray.cluster_resources()
        except Exception as err:  # noqa: BLE001
            return False, f"{type(err).__name__}: {err}"
        shown = {k: v for k, v in sorted(resources.items()) if not k.startswith("node:")}
        return True, f"connected to {self.address or 'a local Ray'}; resources {shown}"

    def shutdown(self) -> None:
        """Stop the local Ray this process started (a remote cluster is left alone)."""
        import ray

        with self._lock:
            if self.started_here and ray.is_initialized():
                ray.shutdown()
            self.started_here = False
