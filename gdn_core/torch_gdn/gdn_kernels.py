"""Kernels of the gated delta rule on one chip, behind flash-linear-attention's calling
convention, so that context parallelism (cp.kernel_rule) composes any of them through its
public call alone:

    kernel(q [B, T, Hk, Dk], k [B, T, Hk, Dk], v [B, T, Hv, Dv], g [B, T, Hv] (log decay),
           beta [B, T, Hv], *, initial_state [B, Hv, Dk, Dv] | None = None,
           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
           cu_seqlens: int [N+1] on the host | None = None)
        -> (o [B, T, Hv, Dv] in q's dtype, final_state [B, Hv, Dk, Dv] float32 | None)

Hv a multiple of Hk, value head j reading key head j // (Hv/Hk) (fla's GVA and ours); scale
Dk^-½; differentiable in every input and in initial_state. cu_seqlens is this project's
convention (documents.py: the same boundaries in every row, one initial state entering the
first document, the final state leaving the last); the fla kernel turns it into fla's own
(one row of B·T tokens, a state per document).

    reference  this project's chunk_gated_delta_rule (chunk.py): the CPU stand-in through the
               same CP composition the fla kernel takes
    fla        fla-core's chunk_gated_delta_rule (Triton: CUDA, or on a CPU under Triton's
               interpreter with GDN_SWEEP_INTERPRET_KERNELS=1; imported at the first call)

`resolve_torch_gdn_kernel` names what a torch step runs for the `kernels` dimension at a point
(names from gdn_core.kernels, the rule book) with the kernel to compose, or raises
KernelUnavailable with the reason fla cannot serve it: never the reference under the fused name.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Protocol, get_args

import torch

from .. import kernels as rule_book
from ..interpreted_kernels import interpret_kernels_enabled, is_interpreted, triton_interpreter_on
from ..kernels import FLA_CHUNK_SIZES, Kernels, KernelUnavailable, check_kernels
from .chunk import chunk_gated_delta_rule
from .device_index import device_index
from .fla_interpreter import load_fla_cp_context_builder, load_fla_gated_delta_rule

GDNKernelName = Literal["reference", "fla", "fla_cp_context"]
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
                 output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                 cu_seqlens: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ReferenceGDNKernel:
    """This package's chunked rule behind fla's convention (runs on any device)."""

    chunk_size: int = 64
    name: ClassVar[str] = "reference"

    def __call__(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm=use_qk_l2norm_in_kernel,
                                      chunk_size=self.chunk_size, cu_seqlens=cu_seqlens)


@dataclasses.dataclass(frozen=True, slots=True)
class FlaGDNKernel:
    """fla-core's chunk_gated_delta_rule; imported lazily so that this module loads anywhere.

    interpreted: on CPU tensors, run it under Triton's interpreter (interpreted_kernels;
    float32 only). A call on a non-CUDA tensor otherwise, or without fla-core, raises
    KernelUnavailable (a resolver should have said so before the step was built; this is the
    guard that no call falls back).
    """

    chunk_size: int = 64
    interpreted: bool = False
    name: ClassVar[str] = "fla"

    def __post_init__(self) -> None:
        if self.chunk_size not in FLA_CHUNK_SIZES:
            raise KernelUnavailable(f"fla-core's chunk_gated_delta_rule takes chunk_size "
                                    f"{', '.join(map(str, FLA_CHUNK_SIZES))}, got "
                                    f"chunk_size={self.chunk_size}")

    def __call__(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        fla_rule = self._load(q.device)
        B, T, Hv, Dk, Dv = *v.shape[:3], k.shape[-1], v.shape[-1]
        h0_BHKV = None if initial_state is None else initial_state.float().contiguous()
        if cu_seqlens is None:
            return fla_rule(q, k, v, g, beta, initial_state=h0_BHKV,
                            output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            chunk_size=self.chunk_size)
        # fla packs along T with B = 1 and a state per document: the B rows side by side.
        bounds = tuple(cu_seqlens.tolist())
        flat_cu = device_index(_rows_side_by_side, bounds, B, T, device=q.device)
        per_row = len(_document_bounds(bounds, T)) - 1
        h0_NHKV = q.new_zeros(B, per_row, Hv, Dk, Dv, dtype=torch.float32)
        if h0_BHKV is not None:  # the first document of each row starts from its state
            h0_NHKV = torch.cat([h0_BHKV[:, None], h0_NHKV[:, 1:]], dim=1)
        o, final_NHKV = fla_rule(
            *(x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, g, beta)),
            initial_state=h0_NHKV.reshape(B * per_row, Hv, Dk, Dv),
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, chunk_size=self.chunk_size,
            cu_seqlens=flat_cu)
        final_BHKV = None if final_NHKV is None else \
            final_NHKV.reshape(B, per_row, Hv, Dk, Dv)[:, -1]
        return o.reshape(B, T, Hv, Dv), final_BHKV

    def _load(self, device: torch.device):
        if device.type == "cpu" and self.interpreted:
            return load_fla_gated_delta_rule()
        if device.type != "cuda":
            raise KernelUnavailable("fla-core's chunk_gated_delta_rule needs a CUDA device "
                                    f"(Triton); got tensors on {device.type}")
        if triton_interpreter_on():  # it would run, slowly, and be timed as the kernel
            raise KernelUnavailable("Triton's interpreter is on in this process "
                                    "(TRITON_INTERPRET=1 or GDN_SWEEP_INTERPRET_KERNELS=1): "
                                    "unset it to run fla-core's kernels on the GPU")
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_rule
        except ImportError as err:
            raise KernelUnavailable(f"fla-core cannot be imported ({err}); pip install "
                                    "fla-core") from err
        return fla_rule


@dataclasses.dataclass(frozen=True, slots=True)
class FlaCPContextKernel(FlaGDNKernel):
    """fla-core's rule with fla's OWN context parallelism (fla.ops.cp's cp_context) in place
    of this package's exchanges: under the all_gather mode only (it all-gathers each rank's
    affine chain and merges), for one sequence row, with no initial state in and no final
    state out (fla's CP takes neither). A call on a whole sequence (one chip, ulysses' heads)
    is fla's plain rule. Selected with gdn_kernel="fla_cp_context"; compared with this
    package's composition of fla ("fla") by `python -m gdn_core.bench cp --gdn-kernels`."""

    name: ClassVar[str] = "fla_cp_context"

    def all_gather(self, q, k, v, g, beta, *, group, layout: str, cu_seqlens=None,
                   use_qk_l2norm_in_kernel: bool = False) -> torch.Tensor:
        """This rank's shard of o ([1, t, Hv, Dv]) under fla's cp_context: cu_seqlens the
        GLOBAL packed documents (host int, this project's convention; None: one document)."""
        import torch.distributed as dist

        group = dist.group.WORLD if group is None else group  # fla wants the group itself
        B, t = q.shape[:2]
        if B != 1:
            raise KernelUnavailable(f"fla's cp_context packs one row (B = 1), got batch={B}; "
                                    "use gdn_kernel='fla' (this package's CP with fla)")
        T = t * dist.get_world_size(group)
        bounds = (0, T) if cu_seqlens is None else _document_bounds(
            tuple(cu_seqlens.tolist()), T)
        build = self._load_cp_context_builder(q.device)
        cu_host = torch.tensor(bounds, dtype=torch.int64)
        context = build(cu_host.to(q.device), group=group, layout=layout, cu_seqlens_cpu=cu_host)
        o, _ = self._load(q.device)(q, k, v, g, beta, cp_context=context,
                                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                    chunk_size=self.chunk_size)
        return o

    def _load_cp_context_builder(self, device: torch.device):
        if device.type == "cpu" and self.interpreted:
            return load_fla_cp_context_builder()
        self._load(device)  # the same refusals as the plain kernel's (fla imported there)
        try:
            from fla.ops.cp import build_cp_context
        except ImportError as err:
            raise KernelUnavailable(f"this fla-core has no cp_context ({err})") from err
        return build_cp_context


def _document_bounds(bounds: tuple[int, ...], seq_len: int) -> tuple[int, ...]:
    """cu_seqlens without its empty documents (fla takes none): 0 = c_0 < … < c_n = T."""
    return tuple(sorted({0, seq_len, *bounds}))


def _rows_side_by_side(bounds: tuple[int, ...], rows: int, seq_len: int) -> list[int]:
    """fla's cu_seqlens of `rows` rows of seq_len tokens laid end to end, each packed as
    `bounds` says."""
    inner = _document_bounds(bounds, seq_len)[:-1]
    return [row * seq_len + c for row in range(rows) for c in inner] + [rows * seq_len]


def gdn_rule_kernel(name: str, *, chunk_size: int = 64) -> GDNRuleKernel:
    """The kernel called `name` (GDN_KERNELS) at `chunk_size` tokens per chunk."""
    if name not in GDN_KERNELS:
        raise ValueError(f"gdn_kernel={name!r} is not one of: {', '.join(GDN_KERNELS)}")
    if name in ("fla", "fla_cp_context"):
        kernel = FlaGDNKernel if name == "fla" else FlaCPContextKernel
        return kernel(chunk_size, interpreted=interpret_kernels_enabled())
    return ReferenceGDNKernel(chunk_size)


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
    if is_interpreted(name):
        return name, FlaGDNKernel(chunk_size, interpreted=True)
    if not torch.cuda.is_available():
        raise KernelUnavailable(f"{name}: CUDA is not available on this host")
    return name, FlaGDNKernel(chunk_size)


FLA_BACKWARD_REFUSAL_MARKS = ("#640", "chunk_bwd_dqkwg")
"""What fla-core's own refusal of its gated backward says (fla issue #640: Hopper with
3.4.0 <= Triton < 3.7.1 and no tilelang), raised as a RuntimeError in the step's backward;
kernels.fla_gated_backward_problem is the same rule asked before the step."""


def kernel_refusal(error: BaseException) -> KernelUnavailable | None:
    """A library kernel's own refusal of the point, raised where it runs (fla-core's gated
    backward: FLA_BACKWARD_REFUSAL_MARKS), as the KernelUnavailable a trial is skipped with;
    None for any other error."""
    if isinstance(error, RuntimeError) and any(mark in str(error)
                                               for mark in FLA_BACKWARD_REFUSAL_MARKS):
        return KernelUnavailable(f"fla-core refused to run its gated backward here: {error}")
    return None


__all__ = ["FLA_BACKWARD_REFUSAL_MARKS", "FUSED_GDN_KERNEL", "FlaCPContextKernel",
           "FlaGDNKernel", "GDNKernelName", "GDNRuleKernel", "GDN_KERNELS",
           "ReferenceGDNKernel", "gdn_rule_kernel", "kernel_refusal",
           "resolve_torch_gdn_kernel"]
