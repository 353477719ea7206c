"""The `kernels` dimension: which implementation a training step runs (docs/architecture.md,
"Kernels").

    reference  this project's own torch / JAX code: the ground truth every check compares to
    fused      what a training team runs: library kernels (fla-core's chunk_gated_delta_rule,
               SDPA's flash backend, cuDNN or splash attention) and, for JAX's GDN, this
               project's Pallas chunk rule, composed with our CP exchanges

A fused point that a kernel cannot serve (dtype, chunk size, head dim, backend missing) raises
KernelUnavailable with the reason, and the trial is recorded `skipped` with it: a fused trial
never falls back to the reference silently. Each result stores the resolved implementation of
the GDN rule and of attention (ResolvedKernels), with versions.

`resolve_kernels` is the rule book: what a framework runs under each value on a device kind,
dtype and attention head width, or KernelUnavailable. It imports no kernel (only package
versions are read and fla-core's presence checked), so a worker calls it before a trial is
built; the names it returns are the constants below, which the kernel modules reuse.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from .interpreted_kernels import (FLA_DTYPES_INTERPRETED, INTERPRET_ENV,
                                  interpret_kernels_enabled, triton_installed)
from .interpreted_kernels import interpreted as interpreted_name
from .train_config import check_framework

Kernels = Literal["reference", "fused"]
KERNELS: tuple[str, ...] = get_args(Kernels)
DEFAULT_KERNELS: Kernels = "reference"


def check_kernels(kernels: str) -> None:
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r} is not one of: {', '.join(KERNELS)}")


class KernelUnavailable(RuntimeError):
    """A fused kernel cannot serve this point; str(error) is the reason a skipped trial
    records (what was asked, what the kernel accepts)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedKernels:
    """The implementations a step really runs, named with their versions (stored per result)."""

    gdn: str
    """The GDN rule, e.g. "reference jax chunk rule" or "fla-core 0.6.0 chunk_gated_delta_rule"."""
    attention: str | None
    """The full-attention layers' kernel, e.g. "torch 2.13.0 sdpa flash"; None without
    attention layers (a gdn_only model)."""


# --------------------------------------------------------------------- what each path is called
# One place for the names a result stores; the attention and GDN modules reuse them.

REFERENCE_GDN: dict[str, str] = {"torch": "reference torch chunk rule",
                                 "jax": "reference jax chunk rule"}
"""The GDN rule under kernels="reference", per framework (this project's own code)."""
REFERENCE_ATTENTION: dict[str, str] = {"torch": "reference torch blockwise tiles",
                                       "jax": "reference jax blockwise"}
"""The hybrid's attention under kernels="reference", per framework."""
JAX_PALLAS_GDN = "gdn_core pallas chunk rule"
"""JAX's GDN under kernels="fused": this project's Pallas chunk rule (jax_gdn.pallas), composed with every CP mode through its state in and out (jax_gdn.cp.
kernel_rule); stored with its platform, "(tpu)" / "(gpu)", or "(interpreted)" on a CPU."""
PALLAS_PLATFORMS: dict[str, str] = {"tpu": "tpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}
"""Device kind or jax backend → the Pallas rule's parameterisation (Mosaic TPU, Triton GPU)."""
PALLAS_NEEDS_A_CHIP = ("the Pallas chunk rule needs a TPU or GPU; on a CPU set "
                       f"{INTERPRET_ENV}=1 to run it through Pallas's interpreter")
FLA_GDN = "fla-core {version} chunk_gated_delta_rule"
FLA_CP_CONTEXT_GDN = "fla-core {version} chunk_gated_delta_rule with its cp_context (all_gather)"
"""fla's own context parallelism in place of our exchanges (torch_gdn.gdn_kernels.
FlaCPContextKernel, gdn_kernel="fla_cp_context"): the alternative the benchmark times."""
TORCH_SDPA_FLASH = "torch {version} sdpa flash ({device})"
JAX_DOT_PRODUCT_ATTENTION = "jax {version} dot_product_attention {implementation}"
"""implementation: "xla" (CPU) or "cudnn" (GPU)."""
JAX_SPLASH_ATTENTION = "jax {version} splash attention"

DEVICE_KINDS: tuple[str, ...] = ("cpu", "gpu", "tpu")
HALF_DTYPES: tuple[str, ...] = ("bfloat16", "float16")
"""What the GPU flash kernels (SDPA's flash backend, cuDNN attention) compute in."""
SDPA_FLASH_MAX_HEAD_DIM = 256
"""The widest head SDPA's flash backend serves on a GPU."""
CUDNN_MAX_HEAD_DIM = 256
"""cuDNN flash attention's head-dim limit on Hopper and later (128 before; jax checks the
device's compute capability when it runs)."""
SPLASH_HEAD_DIM_MULTIPLE = 128
"""Splash attention's heads fill TPU lanes."""
FLA_DISTRIBUTION = "fla-core"
FLA_MODULE = "fla"
FLA_CHUNK_SIZES: tuple[int, ...] = (16, 32, 64)
"""The chunk sizes fla-core 0.6's chunk_gated_delta_rule accepts (ours also takes 128)."""
FLA_MAX_HEAD_K_DIM = 256
"""The widest key head fla-core 0.6's state kernels serve (chunk_delta_h asserts K <= 256)."""
FLA_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""The q/k/v dtypes fla-core's Triton kernels compute in (float32 dots run as TF32)."""


def jax_fused_gdn_name(backend: str) -> str:
    """What JAX's GDN runs under kernels="fused" on `backend` (a device kind or jax backend:
    tpu, gpu, cuda, rocm, cpu): the Pallas chunk rule for its platform, interpreted on a CPU
    under GDN_SWEEP_INTERPRET_KERNELS=1; KernelUnavailable(PALLAS_NEEDS_A_CHIP) elsewhere."""
    if backend in PALLAS_PLATFORMS:
        return f"{JAX_PALLAS_GDN} ({PALLAS_PLATFORMS[backend]})"
    if backend == "cpu" and interpret_kernels_enabled():
        return interpreted_name(JAX_PALLAS_GDN)
    raise KernelUnavailable(PALLAS_NEEDS_A_CHIP if backend == "cpu" else
                            f"{PALLAS_NEEDS_A_CHIP} (this trial runs on {backend!r})")


def resolve_kernels(framework: str, kernels: str, *, device_kind: str, dtype: str,
                    head_dim: int | None, has_attention: bool,
                    gdn_head_k_dim: int | None = None,
                    gdn_chunk_size: int | None = None,
                    packed_documents: bool = False) -> ResolvedKernels:
    """The implementations a step of `framework` runs under `kernels` on a `device_kind` chip
    ("cpu" | "gpu" | "tpu") in `dtype`, with attention layers of `head_dim` if
    `has_attention`; KernelUnavailable(reason) when a fused kernel cannot serve the point
    (every reason found, joined by "; "). gdn_head_k_dim / gdn_chunk_size (the GDN layers'
    key head width and chunk size), where given, are checked against what fla-core serves.
    packed_documents (the step packs its sequences, TrainConfig.documents): a fused kernel
    that takes no document boundaries cannot serve it (_packed_documents_problem). Pure
    rules: no kernel is imported, only versions looked up and fla-core's presence
    checked, so it runs where the trial runs (the worker knows its device and packages)
    before anything is built."""
    _check_point(framework, kernels, device_kind)
    if kernels == "reference":
        return ResolvedKernels(gdn=REFERENCE_GDN[framework],
                               attention=REFERENCE_ATTENTION[framework] if has_attention else None)
    rules = _FUSED[framework]
    reasons, names = [], []
    gdn_shape = {"gdn_head_k_dim": gdn_head_k_dim, "gdn_chunk_size": gdn_chunk_size}
    for i, rule in enumerate((rules[0], *(rules[1:] if has_attention else ()))):
        try:
            names.append(rule(device_kind=device_kind, dtype=dtype, head_dim=head_dim,
                              **(gdn_shape if i == 0 else {})))
        except KernelUnavailable as err:
            reasons.append(str(err))
            continue
        problem = _packed_documents_problem(framework, i, device_kind) if packed_documents \
            else None
        if problem is not None:
            reasons.append(f"{problem}; use documents: [single] or kernels: [reference]")
    if reasons:
        raise KernelUnavailable("; ".join(reasons))
    return ResolvedKernels(gdn=names[0], attention=names[1] if has_attention else None)


def attention_kernel_name(framework: str, kernels: str, *, device_kind: str, dtype: str,
                          head_dim: int | None) -> str:
    """resolve_kernels' attention part alone: the name of what `framework` runs for the
    hybrid's attention, or KernelUnavailable(reason). The framework's own resolver
    (torch_gdn.attention_kernels, jax_gdn.kernels) starts here and adds what only the running
    process can check (CUDA present, the device's capability, a library's private API)."""
    _check_point(framework, kernels, device_kind)
    if kernels == "reference":
        return REFERENCE_ATTENTION[framework]
    return _FUSED[framework][1](device_kind=device_kind, dtype=dtype, head_dim=head_dim)


def _packed_documents_problem(framework: str, part: int, device_kind: str) -> str | None:
    """Why the fused kernel of `part` (0: the GDN rule, 1: attention) cannot serve packed
    documents on a device_kind chip, or None where it can: the step would raise on the first
    forward, so the trial is skipped with the reason before anything is built instead."""
    splash_on_cpu = device_kind == "cpu" and interpret_kernels_enabled()  # interpreted
    if framework == "jax" and part == 1 and (device_kind in ("gpu", "tpu") or splash_on_cpu):
        kernel = "cuDNN" if device_kind == "gpu" else "splash"
        return (f"{kernel} attention as bound here takes no mask, so it cannot serve packed "
                "documents (cu_seqlens)")
    # fla takes cu_seqlens (torch_gdn.cp.kernel_rule: segment-local boundaries), the Pallas
    # rule document starts (jax_gdn.cp.kernel_rule), SDPA flash and XLA attend per document
    # pair.
    return None


def _check_point(framework: str, kernels: str, device_kind: str) -> None:
    check_framework(framework)
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device_kind={device_kind!r} is not one of: {', '.join(DEVICE_KINDS)}")
    check_kernels(kernels)


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def _fla_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec(FLA_MODULE) is not None


def _half_only(what: str, dtype: str) -> None:
    if dtype not in HALF_DTYPES:
        raise KernelUnavailable(f"{what} takes dtype {' or '.join(HALF_DTYPES)}, got "
                                f"dtype={dtype!r}; use dtypes: [bfloat16] or kernels: [reference]")


def _torch_fused_gdn(*, device_kind: str, dtype: str, head_dim: int | None,
                     gdn_head_k_dim: int | None = None, gdn_chunk_size: int | None = None) -> str:
    """fla-core's chunk_gated_delta_rule, composed with our CP exchanges through its public
    initial_state (torch_gdn.cp.kernel_rule), where it can serve the point."""
    interpreted = device_kind == "cpu" and interpret_kernels_enabled()
    if device_kind != "gpu" and not interpreted:
        hint = (f" ({INTERPRET_ENV}=1 runs it through Triton's interpreter on a CPU: a "
                "correctness check, not a speed)") if device_kind == "cpu" else ""
        raise KernelUnavailable("fla-core's chunk_gated_delta_rule needs a CUDA device "
                                f"(Triton); this trial runs on {device_kind}{hint}")
    if not _fla_installed():
        raise KernelUnavailable(f"fla-core is not installed on this worker (no module "
                                f"{FLA_MODULE!r}); fused torch GDN runs fla-core's "
                                "chunk_gated_delta_rule: pip install fla-core")
    name = FLA_GDN.format(version=_version(FLA_DISTRIBUTION))
    reasons = []
    dtypes = FLA_DTYPES_INTERPRETED if interpreted else FLA_DTYPES
    if interpreted and not triton_installed():
        reasons.append("runs under Triton's interpreter, and triton is not installed "
                       "(pip install 'gdn-sweep[kernels]')")
    if dtype not in dtypes:
        where = " under Triton's interpreter (numpy has no bfloat16)" if interpreted else ""
        reasons.append(f"takes dtype {', '.join(dtypes)}{where}, got dtype={dtype!r}")
    if gdn_chunk_size is not None and gdn_chunk_size not in FLA_CHUNK_SIZES:
        reasons.append(f"takes chunk_size {', '.join(map(str, FLA_CHUNK_SIZES))}, got "
                       f"chunk_size={gdn_chunk_size}")
    if gdn_head_k_dim is not None and gdn_head_k_dim > FLA_MAX_HEAD_K_DIM:
        reasons.append(f"serves head_k_dim up to {FLA_MAX_HEAD_K_DIM}, got "
                       f"head_k_dim={gdn_head_k_dim}")
    if reasons:
        raise KernelUnavailable(f"{name} {' and '.join(reasons)}; use kernels: [reference]")
    if device_kind == "gpu":
        problem = fla_gated_backward_problem(**_cuda_device_facts())
        if problem is not None:
            raise KernelUnavailable(f"{name}: {problem}")
    return interpreted_name(name) if interpreted else name


FLA_HOPPER_BAD_TRITON = ("3.4.0", "3.7.1")
"""Triton versions [from, to) whose gated chunk_bwd_dqkwg is wrong on Hopper (fla issue #640);
fla-core 0.6.0 raises there unless tilelang serves that kernel instead."""


def fla_gated_backward_problem(*, device_name: str, capability: tuple[int, int] | None,
                               triton_version: str | None, tilelang_installed: bool
                               ) -> str | None:
    """Why fla-core 0.6.0's gated backward refuses to train on this GPU, or None: on Hopper
    (compute capability 9.x, or a device named "NVIDIA H…", as fla decides) with
    3.4.0 ≤ Triton < 3.7.1 and no tilelang it raises in chunk_bwd_dqkwg. Its forward still
    runs (the kernel benchmark times it)."""
    hopper = (capability is not None and capability[0] == 9) or "NVIDIA H" in device_name
    if not hopper or triton_version is None or tilelang_installed:
        return None
    low, high = FLA_HOPPER_BAD_TRITON
    if not _version_tuple(low) <= _version_tuple(triton_version) < _version_tuple(high):
        return None
    return (f"its gated backward gives wrong gradients with Triton {triton_version} on Hopper "
            f"({device_name}; {low} <= Triton < {high}, fla issue #640) and refuses to run "
            f"without tilelang: training needs Triton >= {high} or `pip install tilelang` "
            "(the forward alone still runs)")


def _version_tuple(version: str) -> tuple[int, ...]:
    import re

    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def _cuda_device_facts() -> dict:
    """fla_gated_backward_problem's arguments for this process's first CUDA device."""
    import importlib.util

    import torch

    cuda = torch.cuda.is_available()
    return dict(device_name=torch.cuda.get_device_name(0) if cuda else "",
                capability=tuple(torch.cuda.get_device_capability(0)) if cuda else None,
                triton_version=_version("triton") if triton_installed() else None,
                tilelang_installed=importlib.util.find_spec("tilelang") is not None)


def _torch_fused_attention(*, device_kind: str, dtype: str, head_dim: int | None) -> str:
    if device_kind == "tpu":
        raise KernelUnavailable("torch has no TPU path; SDPA's flash backend runs on cpu or gpu")
    if device_kind == "gpu":
        _half_only("SDPA's flash backend on gpu", dtype)
        if head_dim is not None and head_dim > SDPA_FLASH_MAX_HEAD_DIM:
            raise KernelUnavailable(f"SDPA's flash backend serves head_dim up to "
                                    f"{SDPA_FLASH_MAX_HEAD_DIM}, got head_dim={head_dim}")
    return TORCH_SDPA_FLASH.format(version=_version("torch"), device=device_kind)


def _jax_fused_gdn(*, device_kind: str, dtype: str, head_dim: int | None,
                   gdn_head_k_dim: int | None = None, gdn_chunk_size: int | None = None) -> str:
    """The Pallas chunk rule (any dtype, chunk size and head width: it pads nothing but T)."""
    return jax_fused_gdn_name(device_kind)


def _jax_fused_attention(*, device_kind: str, dtype: str, head_dim: int | None) -> str:
    version = _version("jax")
    if device_kind == "tpu":
        if head_dim is not None and head_dim % SPLASH_HEAD_DIM_MULTIPLE:
            raise KernelUnavailable(f"splash attention needs head_dim a multiple of "
                                    f"{SPLASH_HEAD_DIM_MULTIPLE} (TPU lanes), got "
                                    f"head_dim={head_dim}")
        return JAX_SPLASH_ATTENTION.format(version=version)
    if device_kind == "gpu":
        _half_only("cuDNN's dot_product_attention", dtype)
        if head_dim is not None and (head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM):
            raise KernelUnavailable(f"cuDNN flash attention needs head_dim a multiple of 8 and "
                                    f"<= {CUDNN_MAX_HEAD_DIM}, got head_dim={head_dim}")
        return JAX_DOT_PRODUCT_ATTENTION.format(version=version, implementation="cudnn")
    if interpret_kernels_enabled():
        # Splash through Pallas's interpreter: no TPU lanes to fill, so any head_dim runs
        # (8, 16 checked; float32 and bfloat16); segments still need multiples of 128 tokens,
        # which only the step knows (jax_gdn.kernels.resolve_jax_attention_kernel checks).
        return interpreted_name(JAX_SPLASH_ATTENTION.format(version=version))
    return JAX_DOT_PRODUCT_ATTENTION.format(version=version, implementation="xla")


_FUSED = {"torch": (_torch_fused_gdn, _torch_fused_attention),
          "jax": (_jax_fused_gdn, _jax_fused_attention)}
"""Per framework: (the GDN rule's fused resolver, attention's)."""


__all__ = ["CUDNN_MAX_HEAD_DIM", "DEFAULT_KERNELS", "FLA_CHUNK_SIZES", "FLA_CP_CONTEXT_GDN",
           "FLA_DTYPES", "FLA_GDN", "FLA_HOPPER_BAD_TRITON", "FLA_MAX_HEAD_K_DIM",
           "JAX_DOT_PRODUCT_ATTENTION", "JAX_PALLAS_GDN", "JAX_SPLASH_ATTENTION", "KERNELS",
           "KernelUnavailable", "Kernels", "PALLAS_NEEDS_A_CHIP", "PALLAS_PLATFORMS",
           "REFERENCE_ATTENTION", "REFERENCE_GDN",
           "ResolvedKernels", "SDPA_FLASH_MAX_HEAD_DIM", "SPLASH_HEAD_DIM_MULTIPLE",
           "TORCH_SDPA_FLASH", "attention_kernel_name", "check_kernels",
           "fla_gated_backward_problem", "jax_fused_gdn_name", "resolve_kernels"]
