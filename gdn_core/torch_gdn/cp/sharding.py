"""param_sharding over the step's whole group: every rank of every data-parallel replica (the
flattened dp × cp mesh, cp.mesh) is the FSDP / ZeRO axis; with dp = 1 that is the CP group.
`group` below is that whole group and D its size (all chips).

    replicated  every rank holds all weights, gradients and AdamW state; gradients all-reduced
                (SUM) by train.sum_gradients.
    zero1       torch.distributed.optim.ZeroRedundancyOptimizer over the group: each rank keeps
                AdamW state for its own parameters only; gradients are still all-reduced (SUM)
                by sum_gradients, then every rank updates its parameters and broadcasts them.
    fsdp        FSDP2 fully_shard per decoder block plus the root (embedding, final norm, LM
                head) on a 1-D DeviceMesh over the group: parameters, gradients and AdamW state
                are dim-0 shards; a block's weights are all-gathered before its forward and
                again before its backward, gradients reduce-scattered with SUM (no division:
                each rank's loss is already its share of the global mean). Under bfloat16 the
                gathered copies are bf16 (MixedPrecisionPolicy, reduce in fp32), as torchtitan.

CP ranks hold different sequence shards of one batch and replicas different rows of the global
batch, so gradients are SUMMED over the group in every layout. FSDP2's and ZeRO's own
collectives bypass comm.py's counted wrappers: their bytes come from weight_sync_bytes, an
exact count from the shard sizes (FSDP2 pads dim 0 of every parameter to a multiple of D).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from ...train_config import PARAM_SHARDINGS, TrainConfig
from ..model import DecoderBlock
from ..train import build_optimizer
from .comm import rank_size

COMM_SOURCE = {
    "replicated": "counted_collectives",
    "zero1": "counted_collectives+zero1_broadcast_from_shard_sizes",
    "fsdp": "counted_collectives+fsdp_from_shard_sizes",
}
"""CPTrainReport.comm_source per param_sharding: the CP exchanges are always counted."""


def check_param_sharding(param_sharding: str) -> None:
    if param_sharding not in PARAM_SHARDINGS:
        raise ValueError(f"param_sharding={param_sharding!r} is not one of: "
                         f"{', '.join(PARAM_SHARDINGS)}")


def shard_parameters(model: nn.Module, train_cfg: TrainConfig, *, group,
                     device: str | torch.device | None = None) -> nn.Module:
    """Apply train_cfg.param_sharding's parameter layout to `model` in place; return it.

    Only fsdp changes the model (its parameters become DTensor shards), so call it after
    context_parallel and before building the optimizer. device: where the shards will live
    (default: where the parameters are); name it for a meta-device model, which
    init.materialise then fills shard by shard (FSDP2 shards meta parameters as they are).
    """
    if train_cfg.param_sharding != "fsdp":
        return model
    device_type = torch.device(device).type if device is not None else \
        next(model.parameters()).device.type
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type)
    bf16 = train_cfg.dtype == "bfloat16"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32 if bf16 else None)
    for block in model.modules():
        if isinstance(block, DecoderBlock):
            fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for unit in model.modules():
        if isinstance(unit, FSDPModule):  # each setter acts on its own unit only
            unit.set_gradient_divide_factor(1.0)  # sum, not average
            # A plain SUM instead of PREMUL_SUM(1): gloo has no PREMUL_SUM (NCCL has both).
            if hasattr(unit, "set_force_sum_reduction_for_comms"):
                unit.set_force_sum_reduction_for_comms(True)
    return model


def build_sharded_optimizer(model: nn.Module, train_cfg: TrainConfig,
                            *, group) -> torch.optim.Optimizer:
    """AdamW for train_cfg.param_sharding: ZeroRedundancyOptimizer over `group` under zero1,
    else plain AdamW over the (fsdp: sharded) parameters."""
    if train_cfg.param_sharding == "zero1":
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                       process_group=group, lr=train_cfg.learning_rate,
                                       weight_decay=train_cfg.weight_decay)
    return build_optimizer(model.parameters(), train_cfg)


def full_tensors(tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Each tensor whole (parameters or their gradients): DTensor shards all-gathered (call on
    every rank, in the same order)."""
    return [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors]


def _padded_shard_numel(param: torch.Tensor, D: int) -> int:
    """Elements of one rank's FSDP2 shard: dim 0 padded to a multiple of D, then split."""
    return math.ceil(param.shape[0] / D) * math.prod(param.shape[1:])


def weight_sync_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, train_cfg: TrainConfig,
                      *, group) -> int:
    """Bytes this rank receives per step in collectives that sum_gradients does not record.

    zero1: the broadcast of the parameters other ranks own (their updated values).
    fsdp: per block, all-gathers in forward and in backward (blocks reshard after forward;
    the root does not, so its weights are gathered once) of (D−1) padded shards in the
    gathered dtype, and a reduce-scatter of (D−1) padded shards in the reduce dtype (ring
    convention: (D−1)/D of the unit's padded gradient bytes).
    replicated: 0 (its all-reduce is recorded by sum_gradients).
    """
    _, D = rank_size(group)
    if train_cfg.param_sharding == "zero1":
        own = {id(p) for g in optimizer.optim.param_groups for p in g["params"]}
        return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in own)
    if train_cfg.param_sharding == "replicated":
        return 0
    gather_bytes = 2 if train_cfg.dtype == "bfloat16" else 4
    reduce_bytes = 4
    blocks = [m for m in model.modules() if isinstance(m, DecoderBlock)]
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    block_numel = sum(_padded_shard_numel(p, D) for p in model.parameters() if id(p) in in_blocks)
    root_numel = sum(_padded_shard_numel(p, D) for p in model.parameters()
                     if id(p) not in in_blocks)
    gathered = (D - 1) * (2 * block_numel + root_numel) * gather_bytes
    reduced = (D - 1) * (block_numel + root_numel) * reduce_bytes
    return gathered + reduced


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, DTensor):
            t = t.to_local()
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total


def state_bytes_per_rank(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds (local shards).

    Gradients count where they exist (after backward, before zero_grad); optimizer state after
    the first step.
    """
    local_optimizer = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) \
        else optimizer
    params = list(model.parameters())
    return {
        "params": _local_bytes(params),
        "grads": _local_bytes(p.grad for p in params),
        "optimizer": _local_bytes(v for state in local_optimizer.state.values()
                                  for v in state.values()),
    }
