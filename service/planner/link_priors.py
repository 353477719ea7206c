"""What each chip type's links are assumed to carry before trials measure them: the planner's
communication model where no trials at several chip counts fit one (fits.py), and the link
term of the roofline (roofline.py).

Bandwidths are datasheet figures (NVLink, ICI, PCIe); latencies are assumed, and a CPU host's
virtual chips have no datasheet at all. Chip types are gdn_core.datasheets' (aliases accepted).
"""

from __future__ import annotations

import dataclasses

from gdn_core.datasheets import canonical_accelerator_type


@dataclasses.dataclass(frozen=True, slots=True)
class LinkPrior:
    """What a chip's interconnect is said to do, before any trial measures it."""

    bytes_per_s: float
    """Bytes per second one chip can receive over its chip-to-chip links (all of them)."""
    latency_s: float
    """Time of one dependent exchange round beyond its bytes (assumed, not a datasheet's)."""
    source: str


# Datasheet bandwidth per chip, one direction: NVLink 3/4/5 600/900/1800 GB/s both directions
# (A100, H100/H200, B200 datasheets) → 300/450/900 GB/s in; TPU ICI per chip v4 2,400 Gbps,
# v5e 1,600, v5p 4,800, v6e 3,584 (cloud.google.com/tpu/docs system architecture pages) →
# bytes/s over all links. Latencies are an order of magnitude, 10 µs (NCCL / ICI small-message
# rounds), to be replaced by the fit wherever trials at several chip counts exist. PCIe H100s
# talk over PCIe Gen5 x16 (64 GB/s per direction) without an NVLink bridge.
_NVLINK = "NVLink per-GPU bandwidth (datasheet, one direction); latency assumed 10 µs"
_ICI = "ICI bandwidth per chip (Cloud TPU system architecture); latency assumed 10 µs"
LINK_PRIORS: dict[str, LinkPrior] = {
    "v4": LinkPrior(2400e9 / 8, 10e-6, _ICI), "v5e": LinkPrior(1600e9 / 8, 10e-6, _ICI),
    "v5p": LinkPrior(4800e9 / 8, 10e-6, _ICI), "v6e": LinkPrior(3584e9 / 8, 10e-6, _ICI),
    "a100": LinkPrior(300e9, 10e-6, _NVLINK), "h100-sxm": LinkPrior(450e9, 10e-6, _NVLINK),
    "h100-nvl": LinkPrior(450e9, 10e-6, _NVLINK), "h200-sxm": LinkPrior(450e9, 10e-6, _NVLINK),
    "h200-nvl": LinkPrior(450e9, 10e-6, _NVLINK), "b200": LinkPrior(900e9, 10e-6, _NVLINK),
    "h100-pcie": LinkPrior(64e9, 10e-6, "PCIe Gen5 x16, one direction; latency assumed 10 µs"),
    "cpu": LinkPrior(2e9, 50e-6, "virtual CPU chips of one host: no datasheet; 2 GB/s and "
                     "50 µs assumed (shared-memory collectives of XLA:CPU / gloo)"),
}
"""Interconnect priors by canonical accelerator type (and "cpu"): the planner's
communication model where no trials at several chip counts fit one."""


def link_prior(accelerator_type: str) -> LinkPrior:
    """The prior of `accelerator_type` (aliases accepted; "cpu" for virtual CPU chips)."""
    if accelerator_type == "cpu":
        return LINK_PRIORS["cpu"]
    return LINK_PRIORS[canonical_accelerator_type(accelerator_type)]


__all__ = ["LINK_PRIORS", "LinkPrior", "link_prior"]
