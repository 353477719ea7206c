"""Errors that cross Ray processes: each pickles (`__reduce__`) and names the setting to change.

Ray re-raises an actor's exception in the driver by pickling it; an exception whose
`__init__` takes keyword-only or extra arguments does not survive that unless it says how to
rebuild itself, hence the `__reduce__` on each.
"""

from __future__ import annotations


class PlacementTimeoutError(RuntimeError):
    """A trial's placement group was not ready in time; the group has been removed."""

    def __init__(self, bundles: int, bundle: dict, timeout_s: float, available: float | None,
                 total: float | None) -> None:
        self.bundles, self.bundle, self.timeout_s = bundles, dict(bundle), timeout_s
        self.available, self.total = available, total
        super().__init__(
            f"could not place {bundles} bundle(s) of {bundle} within {timeout_s:g} s "
            f"(cluster now has {available} available of {total} in total); raise "
            f"DriverOptions.placement_timeout_s (gdn-sweep run --placement-timeout-s) if the "
            f"cluster is busy or scaling up, or add chips (CPU hosts advertise virtual chips "
            f"with `ray start --resources='{{\"cpu_chip\": N}}'`, a local Ray takes "
            f"--cpu-chips / GDN_SWEEP_CPU_CHIPS)")

    def __reduce__(self):
        return (type(self), (self.bundles, self.bundle, self.timeout_s, self.available,
                             self.total))


class PlacementCancelledError(RuntimeError):
    """The sweep was cancelled while a trial waited for its chips; the group was removed."""

    def __init__(self, bundles: int) -> None:
        self.bundles = bundles
        super().__init__(f"sweep cancelled while {bundles} bundle(s) waited for placement")

    def __reduce__(self):
        return (type(self), (self.bundles,))


class WorkerStartupError(RuntimeError):
    """A trial's actors or their process group did not come up in time."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what, self.timeout_s = what, timeout_s
        super().__init__(
            f"{what} did not finish within {timeout_s:g} s; raise "
            f"DriverOptions.worker_start_timeout_s (gdn-sweep run --worker-start-timeout-s)")

    def __reduce__(self):
        return (type(self), (self.what, self.timeout_s))


class RankOutOfMemoryError(MemoryError):
    """A rank ran out of memory; carries what is known of its memory when it did."""

    def __init__(self, message: str, peak_memory_bytes: int | None, memory_source: str,
                 limit_bytes: int | None) -> None:
        self.message, self.peak_memory_bytes = message, peak_memory_bytes
        self.memory_source, self.limit_bytes = memory_source, limit_bytes
        limit = "" if limit_bytes is None else (
            f"; address-space cap {limit_bytes} bytes (DriverOptions.rank_memory_limit_bytes)")
        super().__init__(f"{message} (peak {peak_memory_bytes} bytes, {memory_source}{limit})")

    def __reduce__(self):
        return (type(self), (self.message, self.peak_memory_bytes, self.memory_source,
                             self.limit_bytes))


class ChipCapacityError(ValueError):
    """A trial needs more chips than the cluster has, even with nothing else running."""

    def __init__(self, chips: int, resource: str, total: float) -> None:
        self.chips, self.resource, self.total = chips, resource, total
        super().__init__(
            f"trial needs chips={chips} {resource!r} resources but the cluster has {total:g}; "
            f"add hosts, or advertise more virtual chips per CPU host (`ray start "
            f"--resources='{{\"cpu_chip\": N}}'`, or --cpu-chips / GDN_SWEEP_CPU_CHIPS for a "
            f"local Ray)")

    def __reduce__(self):
        return (type(self), (self.chips, self.resource, self.total))


class DeviceMismatchError(RuntimeError):
    """The devices a trial's processes see are not the chip its sweep declared."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(f"{message} (SweepSpec.accelerator.type sets the peak MFU divides by)")

    def __reduce__(self):
        return (type(self), (self.message,))


__all__ = ["ChipCapacityError", "DeviceMismatchError", "PlacementCancelledError",
           "PlacementTimeoutError", "RankOutOfMemoryError", "WorkerStartupError"]
