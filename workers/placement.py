"""A trial's chips: one placement group, one bundle per chip, removed when the trial ends.

CPU hosts advertise virtual chips as the custom resource `cpu_chip` (`ray start
--resources='{"cpu_chip": 8}'`), GPU hosts their GPUs ({"GPU": 1} per bundle). TPU chips of one
VM can only be driven by one process, so a TPU trial reserves whole hosts through Ray's
`ray.util.tpu.SlicePlacementGroup` (one bundle per TPU VM host, {"TPU": chips_per_host}), which
also claims the slice's head resource so all hosts come from one slice.

Which device a process drives follows the hardware: a GPU process keeps every GPU of its node
visible and selects the one Ray assigned it (`cuda_device_index`); a TPU host's process index
is the slice's own worker id (`tpu_worker_id`), so processes are ordered by it, not by bundle.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gdn_core.interpreted_kernels import INTERPRET_ENV, interpret_kernels_enabled

from .errors import PlacementCancelledError, PlacementTimeoutError
from .options import CPU_CHIP_RESOURCE

_RESOURCE_BY_KIND = {"cpu": CPU_CHIP_RESOURCE, "gpu": "GPU", "tpu": "TPU"}
TPU_WORKER_ID_LABEL = "ray.io/tpu-worker-id"
"""Node label Ray sets on a TPU VM host: its worker index within the slice (from TPU_WORKER_ID
on GKE, the metadata server's agent-worker-number on GCE)."""
NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set in a GPU actor's environment, Ray leaves CUDA_VISIBLE_DEVICES as the node has it."""


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


def cuda_device_index(gpu_ids: Sequence[int | str], visible_devices: str | None) -> int:
    """CUDA device index (torch.cuda.set_device, JAX local_device_ids) of this process's GPU.

    gpu_ids: ray.get_gpu_ids() of the process, the one GPU Ray assigned it, named as the node
    names its GPUs (indices, or UUIDs where the node's CUDA_VISIBLE_DEVICES listed UUIDs).
    visible_devices: the process's CUDA_VISIBLE_DEVICES; None means every GPU of the host is
    visible in id order, so the index is the id itself.
    """
    if len(gpu_ids) != 1:
        raise ValueError(f"ray.get_gpu_ids()={list(gpu_ids)!r}: a rank drives exactly one GPU")
    gpu = str(gpu_ids[0]).strip()
    if visible_devices is None:
        if not gpu.isdigit():
            raise ValueError(f"GPU id {gpu!r} is not an index and CUDA_VISIBLE_DEVICES is unset")
        return int(gpu)
    visible = [d.strip() for d in visible_devices.split(",") if d.strip()]
    if gpu not in visible:
        raise ValueError(f"GPU {gpu!r} that Ray assigned is not in "
                         f"CUDA_VISIBLE_DEVICES={visible_devices!r}")
    return visible.index(gpu)


def tpu_worker_id(node_labels: Mapping[str, str],
                  environ: Mapping[str, str] | None = None) -> int:
    """This TPU VM host's worker index within its slice: Ray's node label, else TPU_WORKER_ID.

    It is the index the slice's runtime gives the host, so it must be the host's
    jax.distributed process id (JAX's own auto-detection on a TPU VM reads the same number).
    """
    environ = environ or {}
    value = node_labels.get(TPU_WORKER_ID_LABEL, environ.get("TPU_WORKER_ID"))
    if value is None or not str(value).strip().isdigit():
        raise ValueError(f"TPU worker id: node label {TPU_WORKER_ID_LABEL}="
                         f"{node_labels.get(TPU_WORKER_ID_LABEL)!r}, TPU_WORKER_ID="
                         f"{environ.get('TPU_WORKER_ID')!r}; expected a non-negative integer "
                         f"(is this node a TPU VM host Ray detected?)")
    return int(value)


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
    bundle_tpu_worker_ids: tuple[int, ...] = ()
    """Multi-host TPU slices only: the slice worker id of each bundle's host, by bundle index
    (0 … hosts−1); empty otherwise (one host needs no order)."""

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
        try:
            return cls.from_ready_group(request, pg, chips_per_bundle=chips_per_bundle,
                                        tpu_slice=tpu_slice)
        except BaseException:
            cls._release(pg, tpu_slice)
            raise

    @classmethod
    def from_ready_group(cls, request: ChipRequest, pg: PlacementGroup, *,
                         chips_per_bundle: int = 1, tpu_slice=None) -> "TrialChips":
        """Record where a ready placement group's bundles landed (and, on a multi-host TPU
        slice, the slice worker id of each bundle's host, from its node label)."""
        table = ray.util.placement_group_table(pg)["bundles_to_node_id"]
        nodes = tuple(table[i] for i in range(pg.bundle_count))
        worker_ids: tuple[int, ...] = ()
        if request.accelerator_kind == "tpu" and len(nodes) > 1:
            labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes()}
            worker_ids = tuple(tpu_worker_id(labels.get(node, {})) for node in nodes)
            if sorted(worker_ids) != list(range(len(nodes))):
                raise ValueError(f"TPU hosts of one slice must have worker ids 0..{len(nodes) - 1}"
                                 f", got {worker_ids} (bundle order)")
        return cls(request=request, placement_group=pg, bundle_nodes=nodes,
                   chips_per_bundle=chips_per_bundle, tpu_slice=tpu_slice,
                   bundle_tpu_worker_ids=worker_ids)

    def process_slots(self, *, per_host: bool) -> tuple[tuple[int, ...], ...]:
        """Bundle indices for each worker process, in process (rank) order.

        per_host=True: one process per host holding all its bundles (JAX on CPU); otherwise
        one process per bundle (torch ranks, JAX on GPU). Hosts come in the order their first
        bundle appears and a host's ranks are adjacent, so sequence neighbours stay local where
        they can. A TPU slice has one bundle per host, ordered by the host's worker id: process
        i is the slice's worker i.
        """
        if self.bundle_tpu_worker_ids:
            order = sorted(range(len(self.bundle_nodes)),
                           key=self.bundle_tpu_worker_ids.__getitem__)
            return tuple((b,) for b in order)
        by_node: dict[str, list[int]] = {}
        for index, node in enumerate(self.bundle_nodes):
            by_node.setdefault(node, []).append(index)
        if per_host:
            return tuple(tuple(b) for b in by_node.values())
        return tuple((b,) for bundles in by_node.values() for b in bundles)

    def actor_options(self, bundle: int, *, env: Mapping[str, str] | None = None) -> dict:
        """Ray actor options of the process that drives `bundle` (and its host's other bundles,
        which the placement group keeps reserved for it); `env`: extra environment variables.

        GPU: the process takes its bundle's GPU but every GPU of the node stays visible, since
        NCCL must see its peers to find NVLink (NVIDIA/nccl#1066) — the way torchrun and Ray
        Train (share_cuda_visible_devices) lay GPUs out; it selects its own with
        cuda_device_index(ray.get_gpu_ids(), CUDA_VISIBLE_DEVICES).
        CPU: with GDN_SWEEP_INTERPRET_KERNELS=1 in the driver, the process gets it too (and
        Triton's interpreter on from its start: gdn_core.interpreted_kernels).
        """
        env = dict(env or {})
        options: dict = dict(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.placement_group, placement_group_bundle_index=bundle))
        kind = self.request.accelerator_kind
        if kind == "gpu":
            options["num_gpus"] = 1
            env[NOSET_CUDA_VISIBLE_DEVICES] = "1"
        elif kind == "tpu":
            options["resources"] = {"TPU": self.chips_per_bundle}
        else:
            options["resources"] = {self.request.resource: 1}
            if interpret_kernels_enabled():  # the driver's switch reaches its CPU chips
                env.update({INTERPRET_ENV: "1", "TRITON_INTERPRET": "1"})
        if env:
            options["runtime_env"] = {"env_vars": env}
        return options

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


__all__ = ["ChipRequest", "NOSET_CUDA_VISIBLE_DEVICES", "TPU_WORKER_ID_LABEL", "TrialChips",
           "chip_resource", "cuda_device_index", "tpu_topology", "tpu_worker_id"]
