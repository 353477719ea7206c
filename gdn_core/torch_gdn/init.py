"""Sharded initialisation: build a model on the meta device, lay it out, then give each rank
only its own part of the seeded weights.

    with torch.device("meta"):
        model = language_model(model_cfg, seed=seed)   # shapes only: nothing drawn
    ... context_parallel(model, ...); shard_parameters(model, ..., device=device) ...
    checksum = materialise(model, seed=seed, device=device)

materialise replays the model's seeded init (its init_steps, model.InitStep) one module at a
time: the module's parameters are swapped for full-size host (CPU) tensors, the step draws into
them exactly as reset_parameters does on a whole model (same generator, same order, so the same
values), and each parameter's local part — its FSDP2 shard (a DTensor), or the whole of a plain
parameter — is copied to `device` before the next module. The device never holds more than the
rank's parameters; the host holds one module's (a GDN layer, the embedding) at a time. This is
torchtitan's meta-device flow (parallelize on meta, to_empty, init_weights) except for the
draws: torchtitan initialises the DTensor shards in place with DTensor's own RNG, whose values
are not those of our one-chip build (one CPU generator over the whole model); replaying that
generator on the host keeps them bit for bit, so a CP run and its one-chip reference train the
same weights.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from .model import InitStep


@contextlib.contextmanager
def _host_parameters(module: nn.Module, host: dict[str, torch.Tensor]):
    """Swap module's parameters (dotted names, submodules' included) for the `host` tensors
    while the block runs; the original Parameter objects (FSDP2's included) are put back."""
    originals = []
    try:
        for name, tensor in host.items():
            owner_name, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            originals.append((owner, leaf, owner._parameters[leaf]))
            owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
        yield
    finally:
        for owner, leaf, original in originals:
            owner._parameters[leaf] = original


def local_part(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter's full value `full`: a DTensor's local shard (torch.chunk
    along the sharded dim, as FSDP2 splits, the last shards possibly short or empty), else all."""
    if not isinstance(param, DTensor):
        return full
    if param.device_mesh.ndim != 1:
        raise NotImplementedError(f"materialise: {param.device_mesh.ndim}-D meshes")
    (placement,) = param.placements
    if isinstance(placement, Replicate):
        return full
    if not isinstance(placement, Shard):
        raise NotImplementedError(f"materialise: placement {placement}")
    chunks = torch.chunk(full, param.device_mesh.size(), dim=placement.dim)
    rank = param.device_mesh.get_local_rank()
    part = chunks[rank] if rank < len(chunks) else full.narrow(placement.dim, 0, 0)
    if part.shape != param.to_local().shape:
        raise RuntimeError(f"shard of {tuple(full.shape)} on rank {rank}: the parameter's is "
                           f"{tuple(param.to_local().shape)}, torch.chunk's {tuple(part.shape)}")
    return part


CHECKSUM_SLICE = 2 ** 16
"""Elements float64_sum casts at a time."""


def float64_sum(tensor: torch.Tensor) -> float:
    """Σ tensor in float64, cast CHECKSUM_SLICE elements at a time: a whole float64 copy of
    the largest parameter (an embedding) would cost twice its bytes on top of it."""
    return sum(part.sum(dtype=torch.float64).item()
               for part in tensor.reshape(-1).split(CHECKSUM_SLICE))


@torch.no_grad()
def materialise(model: nn.Module, *, seed: int, device: str | torch.device) -> float:
    """Give a meta-device model its seeded weights on `device`, only this rank's part of each.

    model: built under torch.device("meta") (language_model: GDN-only or hybrid), possibly
    made context-parallel and FSDP2-sharded already. Allocates the local parts (to_empty: a
    DTensor's shard, a plain parameter whole) and fills them by replaying model.init_steps()
    on host tensors (module docstring). Returns the float64 checksum Σ (i+1)·sum(parameter i)
    over model.parameters()' full values: equal on ranks that built equal weights
    (cp.train.check_same_checksum), without gathering anything. Raises RuntimeError if a
    parameter is left undrawn (it would be uninitialised memory).
    """
    model.to_empty(device=device)  # FSDP2 re-points its sharded parameters at the new storage
    index = {id(p): i for i, p in enumerate(model.parameters())}
    generator = torch.Generator(device="cpu").manual_seed(seed)
    steps: list[InitStep] = model.init_steps()
    sums: dict[int, float] = {}  # by parameter index; a parameter drawn twice counts once
    for module, draw in steps:
        params = dict(module.named_parameters())
        # NaN-filled, so a parameter the step does not draw shows up instead of passing as 0.
        host = {name: torch.full(p.shape, float("nan"), dtype=p.dtype)
                for name, p in params.items()}
        with _host_parameters(module, host):
            draw(generator)
        for name, param in params.items():
            full = host.pop(name)
            total = float64_sum(full)
            if math.isnan(total):  # init values are finite: a NaN is one the step left unset
                raise RuntimeError(f"init step of {type(module).__name__} left {name!r} unset")
            target = param.to_local() if isinstance(param, DTensor) else param
            target.copy_(local_part(full, param))
            sums[index[id(param)]] = total
    if len(sums) != len(index):
        unset = [name for i, (name, _) in enumerate(model.named_parameters()) if i not in sums]
        raise RuntimeError(f"no init step draws {unset}: they would be uninitialised memory")
    return sum((i + 1) * total for i, total in sorted(sums.items()))
