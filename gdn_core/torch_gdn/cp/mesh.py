"""The data-parallel × context-parallel mesh of a CP training step (CPSettings.dp).

The step's process group holds all dp × cp_chips ranks; group rank r is replica r // cp_chips
at CP position r % cp_chips (torchtitan's ("dp", "cp") mesh, cp the inner dimension). The CP
layers and their exchanges run on the replica's "cp" sub-group of a 2-D DeviceMesh, so no
exchange leaves a replica; weights, gradients and optimizer state (param_sharding) use the
whole group. dp == 1 builds nothing: the CP group is the step's group itself.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ...cp_modes import check_dp
from .comm import global_rank, rank_size

MESH_DIM_NAMES = ("dp", "cp")

# Sub-groups are process-wide resources (new_group is collective and never freed until the
# whole group is destroyed): a warm process group runs many trials, so build each mesh once.
_MESHES: dict[tuple, DeviceMesh] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class DPCPMesh:
    """Where this rank sits in the dp × cp mesh, and the group its CP exchanges use."""

    dp: int
    """Data-parallel replicas."""
    cp_chips: int
    """Ranks of each replica's CP group (D of the mode's formulas)."""
    replica: int
    """This rank's replica: rows replica·B … (replica+1)·B − 1 of the global batch."""
    cp_rank: int
    """This rank's position in its replica's CP group (its sequence shard)."""
    cp_group: object
    """The process group of this rank's replica (the step's group itself when dp == 1)."""


def dp_cp_mesh(group, *, dp: int, device_type: str) -> DPCPMesh:
    """This rank's place in the dp × (|group| / dp) mesh over `group` (None: the default
    group); call on every rank of the group together (the first call for a shape creates the
    sub-groups, a collective over the default group). Raises ValueError naming the numbers
    unless dp divides the group's size, or when dp > 1 and `group` is not every process of
    the default group (torch creates sub-groups with all of them)."""
    rank, chips = rank_size(group)
    check_dp(dp, chips=chips)
    cp_chips = chips // dp
    if dp == 1:
        return DPCPMesh(dp=1, cp_chips=chips, replica=0, cp_rank=rank, cp_group=group)
    if chips != dist.get_world_size():
        raise ValueError(f"dp={dp} needs the step's group to be the whole default group: it "
                         f"has {chips} of {dist.get_world_size()} processes")
    world = group if group is not None else dist.group.WORLD
    key = (world, dp, cp_chips, device_type)
    if key not in _MESHES:
        ranks_dp_cp = torch.tensor([global_rank(group, r) for r in range(chips)]).view(dp,
                                                                                     cp_chips)
        _MESHES[key] = DeviceMesh(device_type, ranks_dp_cp, mesh_dim_names=MESH_DIM_NAMES)
    cp_group = _MESHES[key].get_group("cp")
    assert dist.get_rank(cp_group) == rank % cp_chips, "the cp dimension must be the inner one"
    return DPCPMesh(dp=dp, cp_chips=cp_chips, replica=rank // cp_chips, cp_rank=rank % cp_chips,
                    cp_group=cp_group)


__all__ = ["MESH_DIM_NAMES", "DPCPMesh", "dp_cp_mesh"]
