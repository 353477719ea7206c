"""Kernels of softmax attention for one (query segment, key segment) pair: what context-parallel
attention (cp.attention) calls for every pair of a rank's query segments and a key block's
segments, merging the pairs by log-sum-exp (`merge_into`).

Every kernel has the same two calls (AttentionKernel); layout [B, heads, tokens, E], query head
h reading key/value head h // (H/G):
    forward(q [B, H, s, E], k, v [B, G, s', E], *, causal, scale)
        -> (o [B, H, s, E] (float32 or q's dtype), lse [B, H, s] float32, natural log)
    backward(do [B, H, s, E], q, k, v, o [B, H, s, E], lse [B, H, s], *, causal, scale)
        -> (dq [B, H, s, E], dk, dv [B, G, s', E]): this pair's share of the gradient
causal=True: a diagonal pair (s = s', the same tokens): query i sees keys 0 … i; False: every
key precedes every query. `o` and `lse` given to backward are the FINAL merged output and
log-sum-exp of these queries over every key they see (flash-style): the pair's probabilities
P = exp(S·scale − lse) are its share of the final softmax and Δ = rowsum(dO ∘ O) the final
one, so dS = P ∘ (dP − Δ) per pair and the pairs' gradients sum to the whole attention's.

    tiles  (reference, `kernels="reference"`) this project's blockwise torch code (tiles.py)
    sdpa   (fused, `kernels="fused"`) ONE call per pair of torch's SDPA flash op and its
           backward (sdpa.py): on CPU _scaled_dot_product_flash_attention_for_cpu, on CUDA
           _scaled_dot_product_flash_attention

`resolve_torch_attention_kernel` names the kernel a step runs at a point (with the torch
version) or raises kernels.KernelUnavailable with the reason the fused one cannot serve it.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

import torch

from ... import kernels as rules
from ...kernels import Kernels, KernelUnavailable, check_kernels
from .sdpa import SdpaKernel, cuda_flash_refusal
from .tiles import BLOCK_TOKENS, TilesKernel, merge_into, tile_pairs

AttentionKernelName = Literal["tiles", "sdpa"]
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernelName)
ATTENTION_KERNEL_FOR: dict[str, AttentionKernelName] = {"reference": "tiles", "fused": "sdpa"}
"""The attention kernel each value of the `kernels` dimension (gdn_core.kernels) runs."""
CPU_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""What the CPU flash op computes in (its kernel's floating types)."""


class AttentionKernel(Protocol):
    """The two calls of the module docstring; `name` is the kernel's (ATTENTION_KERNELS)."""

    name: str

    def forward(self, q_BHsE: torch.Tensor, k_BGsE: torch.Tensor, v_BGsE: torch.Tensor, *,
                causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, do_BHsE: torch.Tensor, q_BHsE: torch.Tensor, k_BGsE: torch.Tensor,
                 v_BGsE: torch.Tensor, o_BHsE: torch.Tensor, lse_BHs: torch.Tensor, *,
                 causal: bool, scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def attention_kernel(name: str, *, block: int = BLOCK_TOKENS) -> AttentionKernel:
    """The kernel called `name`; `block` is the tiles' tile size in tokens (sdpa: unused)."""
    if name not in ATTENTION_KERNELS:
        raise ValueError(f"kernel={name!r} is not one of: {', '.join(ATTENTION_KERNELS)}")
    if block < 1:
        raise ValueError(f"block must be a positive number of tokens, got {block}")
    return TilesKernel(block=block) if name == "tiles" else SdpaKernel()


DEVICE_KIND = {"cpu": "cpu", "cuda": "gpu"}
"""torch device type → gdn_core.kernels' device kind (the types SDPA's flash op serves)."""


def resolve_torch_attention_kernel(kernels: Kernels, *, device: str | torch.device,
                                   dtype: str | torch.dtype, head_dim: int) -> str:
    """The attention kernel a torch step runs for `kernels` on `device` with q/k/v in `dtype`
    (a training dtype name, 'float32' / 'bfloat16', or a torch.dtype) and this head_dim,
    named with its version, e.g. "torch 2.13.0 sdpa flash (gpu)": gdn_core.kernels' rule book
    (dtype and head_dim on a GPU), then what only this process can check (the device type, the
    CPU op's dtypes, CUDA present, the GPU's capability, flash built in). Raises
    KernelUnavailable with the reason where the fused kernel cannot serve the point (the trial
    is then skipped, never run on the reference)."""
    check_kernels(kernels)
    device = torch.device(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if kernels == "fused" and device.type not in DEVICE_KIND:
        raise KernelUnavailable(f"no SDPA flash op for device type {device.type!r} (served: "
                                f"{', '.join(DEVICE_KIND)}); use kernels='reference'")
    name = rules.attention_kernel_name("torch", kernels,
                                       device_kind=DEVICE_KIND.get(device.type, "cpu"),
                                       dtype=str(dtype).removeprefix("torch."),
                                       head_dim=head_dim)
    if kernels == "reference":
        return name
    if device.type == "cpu":
        if dtype not in CPU_FLASH_DTYPES:
            raise KernelUnavailable(
                f"{name} computes in {', '.join(map(str, CPU_FLASH_DTYPES))}, not {dtype}")
        return name
    if not torch.cuda.is_available():
        raise KernelUnavailable(f"{name}: CUDA is not available on this host")
    reason = cuda_flash_refusal(dtype=dtype, head_dim=head_dim,
                                capability=torch.cuda.get_device_capability(device),
                                built=torch.backends.cuda.is_flash_attention_available())
    if reason:
        raise KernelUnavailable(f"{name}: {reason}")
    return name


__all__ = ["ATTENTION_KERNELS", "ATTENTION_KERNEL_FOR", "AttentionKernel",
           "AttentionKernelName", "BLOCK_TOKENS", "SdpaKernel", "TilesKernel",
           "attention_kernel", "merge_into", "resolve_torch_attention_kernel", "tile_pairs"]
