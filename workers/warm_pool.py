"""Idle worker groups kept between trials of one sweep, keyed by shape.

Starting a trial's actors (torch / JAX imports, rendezvous) costs seconds; a trial of the same
shape — framework, chips, accelerator — can run on the same processes and placement group.
JAX fixes its device count per process, hence the chip count in the key. Idle groups hold
their chips, so the driver evicts them (oldest first) when another shape needs room, a group
returned while a trial waits for chips of its kind is shut down rather than kept (it would
hold what the trial waits for: a retry after a lost node, say), and `close()` tears all down
at the end of the sweep.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections import OrderedDict

from .worker_group import WorkerGroup


def peak_resets_per_trial(request) -> bool:
    """Whether a process of this request can measure the next trial's memory peak apart from
    the last one's: JAX on a GPU or TPU cannot reset its allocator's peak
    (gdn_core.device_memory.jax_reset_peak), so such a group is never reused and each of its
    trials starts in fresh processes; CPU RSS marks and torch's CUDA peak reset per trial."""
    return request.framework != "jax" or request.accelerator_kind == "cpu"


class WarmPool:
    """Thread-safe store of idle WorkerGroups; disabled, it shuts groups down on return."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._idle: OrderedDict[int, WorkerGroup] = OrderedDict()  # id → group, oldest first
        self._waiting: collections.Counter = collections.Counter()  # resource → trials placing
        self._lock = threading.Lock()

    def take(self, shape: tuple) -> WorkerGroup | None:
        """An idle group of `shape` (now owned by the caller), or None."""
        with self._lock:
            for key, group in self._idle.items():
                if group.chips.request.shape == shape:
                    del self._idle[key]
                    return group
        return None

    def give(self, group: WorkerGroup) -> None:
        """Return a group that finished a trial cleanly."""
        with self._lock:
            keep = (self.enabled and not self._waiting[group.chips.request.resource]
                    and peak_resets_per_trial(group.chips.request))
            if keep:
                self._idle[id(group)] = group
        if not keep:
            group.shutdown()

    @contextlib.contextmanager
    def waiting_for(self, resource: str, *, evict_idle: bool):
        """While a trial waits for chips of `resource`: groups given back are shut down, and
        with evict_idle the idle ones are first (a retry placing anew after its node died must
        not wait on chips that finished trials left idle here)."""
        with self._lock:
            self._waiting[resource] += 1
        try:
            if evict_idle:
                self.evict(resource, chips=1 << 62)
            yield
        finally:
            with self._lock:
                self._waiting[resource] -= 1

    def idle_chips(self, resource: str, *, except_shape: tuple | None = None) -> int:
        """Chips of `resource` held by idle groups (not counting one of except_shape)."""
        with self._lock:
            groups = list(self._idle.values())
        skipped, total = False, 0
        for group in groups:
            request = group.chips.request
            if request.resource != resource:
                continue
            if request.shape == except_shape and not skipped:
                skipped = True
                continue
            total += request.chips
        return total

    def evict(self, resource: str, chips: int) -> int:
        """Shut down idle groups of `resource`, oldest first, until `chips` are freed."""
        freed, victims = 0, []
        with self._lock:
            for key, group in list(self._idle.items()):
                if freed >= chips:
                    break
                if group.chips.request.resource == resource:
                    victims.append(self._idle.pop(key))
                    freed += group.chips.request.chips
        for group in victims:
            group.shutdown()
        return freed

    def close(self) -> None:
        """Shut down every idle group."""
        with self._lock:
            groups, self._idle = list(self._idle.values()), OrderedDict()
        for group in groups:
            group.shutdown()


__all__ = ["WarmPool"]
