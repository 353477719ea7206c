"""A trial's chips: one placement group, one bundle per chip, removed when the trial ends.

CPU hosts advertise virtual chips as the custom resource `cpu_chip` (`ray start
--resources='{"cpu_chip": 8}'`), GPU hosts their GPUs ({"GPU": 1} per bundle). TPU chips of one
VM can only be driven by one process, so a TPU trial reserves whole hosts through Ray's
`ray.util.tpu.SlicePlacementGroup` (one bundle per TPU VM host, {"TPU": chips_per_host}), which
also claims the slice's head resource so all hosts come from one slice.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from .errors import PlacementCancelledError, PlacementTimeoutError
from .options import CPU_CHIP_RESOURCE

_RESOURCE_BY_KIND = {"cpu": CPU_CHIP_RESOURCE, "gpu": "GPU", "tpu": "TPU"}


def chip_resource(accelerator_kind: str) -> str:
    """Ray resource that counts chips of `accelerator_kind` (cpu_chip, GPU or TPU)."""
    if accelerator_kind not in _RESOURCE_BY_KIND:
        raise ValueError(f"accelerator_kind={accelerator_kind!r} is not one of: "
                         f"{', '.join(_RESOURCE_BY_KIND)}")
    return _RESOURCE_BY_KIND[accelerator_kind]


def tpu_topology(accelerator_type: str, chips: int) -> str:
    """Smallest standard slice topology with `chips` chips, e.g. ("v5p", 8) -> "2x2x2".

    v4 / v5p slices are 3-D tori grown 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, …; v5e / v6e
    slices are 2-D grown 2x2, 2x4, 4x4, 4x8, … (1x1 for one chip). Ray validates the result.
    """
    three_d = accelerator_type.lower() in ("v4", "v5p")
    dims = [2, 2, 1] if three_d else ([1, 1] if chips == 1 else [2, 2])
    while math.prod(dims) < chips:
        smallest = min(dims)
        last = max(i for i, d in enumerate(dims) if d == smallest)
        dims[last] *= 2
    if math.prod(dims) != chips:
        raise ValueError(f"chips={chips} is not a standard {accelerator_type} slice size "
                         f"(next is {math.prod(dims)}); use a power of two >= 4")
    return "x".join(map(str, dims))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ChipRequest:
    """What a trial asks of the cluster; `shape` is the key under which workers are reused."""

    framework: str
    chips: int
    accelerator_kind: str
    accelerator_type: str
    strategy: str = "PACK"

    def __post_init__(self) -> None:
        chip_resource(self.accelerator_kind)
        if self.chips < 1:
            raise ValueError(f"ChipRequest.chips={self.chips!r} must be >= 1")

    @property
    def shape(self) -> tuple[str, int, str, str]:
        return (self.framework, self.chips, self.accelerator_kind, self.accelerator_type)

    @property
    def resource(self) -> str:
        return chip_resource(self.accelerator_kind)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrialChips:
    """A ready placement group and where its bundles landed. Build with `TrialChips.create`."""

    request: ChipRequest
    placement_group: PlacementGroup
    bundle_nodes: tuple[str, ...]
    """Node id of each bundle, by bundle index."""
    chips_per_bundle: int
    """1, except on TPU where a bundle is a whole host."""
    tpu_slice: object | None = None
    """The ray.util.tpu.SlicePlacementGroup handle (TPU only), to release its head group too."""

    @classmethod
    def create(cls, request: ChipRequest, *, timeout_s: float,
               cancelled: Callable[[], bool] = lambda: False,
               poll_interval_s: float = 0.25) -> "TrialChips":
        """Reserve the chips and wait for them; on timeout or cancel remove the group, raise."""
        tpu_slice, chips_per_bundle = None, 1
        if request.accelerator_kind == "tpu":
            from ray.util.tpu import SlicePlacementGroup

            tpu_slice = SlicePlacementGroup(
                topology=tpu_topology(request.accelerator_type, request.chips),
                accelerator_version=request.accelerator_type, strategy="SPREAD",
                head_reservation_timeout_s=timeout_s)
            pg, chips_per_bundle = tpu_slice.placement_group, tpu_slice.chips_per_host
            bundle = tpu_slice.bundle_resources
        else:
            bundle = {request.resource: 1}
            pg = placement_group([dict(bundle)] * request.chips, strategy=request.strategy)
        ready_ref, deadline = pg.ready(), time.monotonic() + timeout_s
        while not ray.wait([ready_ref], timeout=max(0.0, min(
                poll_interval_s, deadline - time.monotonic())))[0]:
            if cancelled():
                cls._release(pg, tpu_slice)
                raise PlacementCancelledError(pg.bundle_count)
            if time.monotonic() < deadline:
                continue
            cls._release(pg, tpu_slice)
            raise PlacementTimeoutError(
                pg.bundle_count, bundle, timeout_s,
                ray.available_resources().get(request.resource),
                ray.cluster_resources().get(request.resource))
        table = ray.util.placement_group_table(pg)["bundles_to_node_id"]
        nodes = tuple(table[i] for i in range(pg.bundle_count))
        return cls(request=request, placement_group=pg, bundle_nodes=nodes,
                   chips_per_bundle=chips_per_bundle, tpu_slice=tpu_slice)

    def process_slots(self, *, per_host: bool) -> tuple[tuple[int, ...], ...]:
        """Bundle indices for each worker process, ranks of one host adjacent.

        per_host=True: one process per host holding all its bundles (JAX on CPU); otherwise
        one process per bundle (torch ranks, JAX on GPU, TPU hosts). Hosts come in the order
        their first bundle appears, so rank order = sequence order stays local where it can.
        """
        by_node: dict[str, list[int]] = {}
        for index, node in enumerate(self.bundle_nodes):
            by_node.setdefault(node, []).append(index)
        if per_host:
            return tuple(tuple(b) for b in by_node.values())
        return tuple((b,) for bundles in by_node.values() for b in bundles)

    def remove(self) -> None:
        """Give the chips back (idempotent)."""
        self._release(self.placement_group, self.tpu_slice)

    @staticmethod
    def _release(pg: PlacementGroup, tpu_slice) -> None:
        if tpu_slice is not None:
            tpu_slice.shutdown()  # removes the worker group and the slice-head reservations
            return
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - already removed (or Ray shutting down): nothing held
            pass


__all__ = ["ChipRequest", "TrialChips", "chip_resource", "tpu_topology"]
