"""Kernels of the gated delta rule on one chip, behind flash-linear-attention's calling
convention, so that context parallelism (cp.kernel_rule) composes any of them through its
public call alone:

    kernel(q [B, T, Hk, Dk], k [B, T, Hk, Dk], v [B, T, Hv, Dv], g [B, T, Hv] (log decay),
           beta [B, T, Hv], *, initial_state [B, Hv, Dk, Dv] | None = None,
           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False)
        -> (o [B, T, Hv, Dv] in q's dtype, final_state [B, Hv, Dk, Dv] float32 | None)

Hv a multiple of Hk, value head j reading key head j // (Hv/Hk) (fla's GVA and ours); scale
Dk^-½; differentiable in every input and in initial_state.

    reference  this project's chunk_gated_delta_rule (chunk.py): the CPU stand-in through the
               same CP composition the fla kernel takes
    fla        fla-core's chunk_gated_delta_rule (Triton, CUDA only; imported at the first call)

`resolve_torch_gdn_kernel` names what a torch step runs for the `kernels` dimension at a point
(names from gdn_core.kernels, the rule book) with the kernel to compose, or raises
KernelUnavailable with the reason fla cannot serve it: never the reference under the fused name.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Protocol, get_args

import torch

from .. import kernels as rule_book
from ..kernels import FLA_CHUNK_SIZES, Kernels, KernelUnavailable, check_kernels
from .chunk import chunk_gated_delta_rule

GDNKernelName = Literal["reference", "fla"]
GDN_KERNELS: tuple[str, ...] = get_args(GDNKernelName)
FUSED_GDN_KERNEL: GDNKernelName = "fla"
"""The GDN kernel kernels="fused" runs (kernels="reference" composes none: the layers keep this
package's own CP rule, which folds chunk pairs without a kernel call)."""


class GDNRuleKernel(Protocol):
    """The call of the module docstring; `name` is one of GDN_KERNELS."""

    name: str
    chunk_size: int

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, *, initial_state: torch.Tensor | None = None,
                 output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ReferenceGDNKernel:
    """This package's chunked rule behind fla's convention (runs on any device)."""

    chunk_size: int = 64
    name: ClassVar[str] = "reference"

    def __call__(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False):
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm=use_qk_l2norm_in_kernel,
                                      chunk_size=self.chunk_size)


@dataclasses.dataclass(frozen=True, slots=True)
class FlaGDNKernel:
    """fla-core's chunk_gated_delta_rule; imported lazily so that this module loads anywhere.

    A call on a non-CUDA tensor, or without fla-core, raises KernelUnavailable (a resolver
    should have said so before the step was built; this is the guard that no call falls back).
    """

    chunk_size: int = 64
    name: ClassVar[str] = "fla"

    def __post_init__(self) -> None:
        if self.chunk_size not in FLA_CHUNK_SIZES:
            raise KernelUnavailable(f"fla-core's chunk_gated_delta_rule takes chunk_size "
                                    f"{', '.join(map(str, FLA_CHUNK_SIZES))}, got "
                                    f"chunk_size={self.chunk_size}")

    def __call__(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False):
        if q.device.type != "cuda":
            raise KernelUnavailable("fla-core's chunk_gated_delta_rule needs a CUDA device "
                                    f"(Triton); got tensors on {q.device.type}")
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_rule
        except ImportError as err:
            raise KernelUnavailable(f"fla-core cannot be imported ({err}); pip install "
                                    "fla-core") from err
        o, final_state = fla_rule(
            q, k, v, g, beta, initial_state=None if initial_state is None else
            initial_state.float().contiguous(), output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, chunk_size=self.chunk_size)
        return o, final_state


def gdn_rule_kernel(name: str, *, chunk_size: int = 64) -> GDNRuleKernel:
    """The kernel called `name` (GDN_KERNELS) at `chunk_size` tokens per chunk."""
    if name not in GDN_KERNELS:
        raise ValueError(f"gdn_kernel={name!r} is not one of: {', '.join(GDN_KERNELS)}")
    return FlaGDNKernel(chunk_size) if name == "fla" else ReferenceGDNKernel(chunk_size)


def _device_kind(device: torch.device) -> str:
    """The rule book's device kind ("cpu" | "gpu" | …) of a torch device."""
    return {"cuda": "gpu"}.get(device.type, device.type)


def resolve_torch_gdn_kernel(kernels: Kernels, *, device: str | torch.device,
                             dtype: str | torch.dtype, chunk_size: int, head_k_dim: int
                             ) -> tuple[str, GDNRuleKernel | None]:
    """(name with version, kernel) of the GDN rule a torch step runs for `kernels` on `device`
    with q/k/v in `dtype` (a training dtype name or a torch.dtype): ("reference torch chunk
    rule", None) under "reference" (the layers' own CP rule, no kernel composed); under
    "fused", e.g. ("fla-core 0.6.0 chunk_gated_delta_rule", FlaGDNKernel). Raises
    KernelUnavailable with the reason where fla cannot serve the point (not a CUDA device or
    none visible, fla-core missing, dtype, chunk size, key head width)."""
    check_kernels(kernels)
    if kernels == "reference":
        return rule_book.REFERENCE_GDN["torch"], None
    device = torch.device(device)
    dtype_name = str(dtype).removeprefix("torch.")
    name = rule_book._torch_fused_gdn(device_kind=_device_kind(device), dtype=dtype_name,
                                      head_dim=None, gdn_head_k_dim=head_k_dim,
                                      gdn_chunk_size=chunk_size)
    if not torch.cuda.is_available():
        raise KernelUnavailable(f"{name}: CUDA is not available on this host")
    return name, FlaGDNKernel(chunk_size)


__all__ = ["FUSED_GDN_KERNEL", "FlaGDNKernel", "GDNKernelName", "GDNRuleKernel", "GDN_KERNELS",
           "ReferenceGDNKernel", "gdn_rule_kernel", "resolve_torch_gdn_kernel"]
