"""The service's connection to Ray: a local Ray when RAY_ADDRESS is empty, else that cluster.

Connecting is the workers' `connect_ray`: a local Ray listens on 127.0.0.1 only, advertises
GDN_SWEEP_CPU_CHIPS virtual CPU chips (default: one per usable core) and runs its dashboard on
GDN_SWEEP_RAY_DASHBOARD_PORT (unless GDN_SWEEP_RAY_INCLUDE_DASHBOARD=false); a secured remote
cluster needs RAY_AUTH_MODE=token and its token (see workers/cluster.py).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from workers.cluster import connect_ray, shutdown_ray

log = logging.getLogger(__name__)


class RayConnection:
    """Connect once (the scheduler does at start; retried while sweeps wait), remember the
    last error for /api/health.

    Ray is started and stopped on a thread of this connection's own: a local Ray's processes
    are SIGKILLed when the thread that started them ends (PR_SET_PDEATHSIG), so starting it
    on the scheduler's thread killed it, ungracefully, the moment the scheduler stopped.
    """

    def __init__(self, address: str, *, cpu_chips: int | None = None,
                 dashboard_port: int | None = None,
                 include_dashboard: bool | None = None) -> None:
        self.address = address
        self.cpu_chips = cpu_chips
        self._local_options = {"dashboard_port": dashboard_port,
                               "include_dashboard": include_dashboard}
        self.error: str | None = None
        self.started_here = False
        self.connected_here = False
        """True once this connection connected the process (a Ray it found is not its own)."""
        self._lock = threading.Lock()
        self._owner: ThreadPoolExecutor | None = None

    def _on_owner_thread(self, fn, *args, **kwargs):
        if self._owner is None:
            self._owner = ThreadPoolExecutor(1, thread_name_prefix="gdn-sweep-ray")
        return self._owner.submit(fn, *args, **kwargs).result()

    def ensure(self) -> bool:
        """Connect if not connected yet; False (and `error` set) when Ray is unreachable."""
        import ray

        with self._lock:
            if ray.is_initialized():
                return True
            try:
                info = self._on_owner_thread(connect_ray, self.address,
                                             cpu_chips=self.cpu_chips, **self._local_options)
            except Exception as err:  # noqa: BLE001 - reported through health
                self.error = f"{type(err).__name__}: {err}"
                log.error("cannot reach Ray at %r: %s", self.address or "(local)", self.error)
                return False
            self.error, self.started_here = None, info.started_locally
            self.connected_here = True
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

    @classmethod
    def from_settings(cls, settings) -> RayConnection:
        return cls(settings.ray_address, cpu_chips=settings.cpu_chips,
                   dashboard_port=settings.ray_dashboard_port,
                   include_dashboard=settings.ray_include_dashboard)

    def shutdown(self) -> None:
        """Undo what `ensure` did: stop the local Ray it started, every process of it, or
        disconnect from a remote cluster. A Ray the process had before is left alone."""
        import ray

        with self._lock:
            if self.connected_here and ray.is_initialized():
                self._on_owner_thread(shutdown_ray)
                log.info("local Ray stopped" if self.started_here else "Ray disconnected")
            self.started_here = self.connected_here = False
            if self._owner is not None:
                self._owner.shutdown()
                self._owner = None
