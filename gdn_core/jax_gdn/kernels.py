"""Which JAX implementation the `kernels` setting (gdn_core.kernels) runs, named with versions.

    attention  reference  attention.py's blockwise tiles ("reference jax blockwise")
               fused      per backend: cpu → jax.nn.dot_product_attention's xla implementation,
                          gpu → cuDNN flash attention, tpu → splash attention
                          (attention_fused.py), merged over segment pairs by log-sum-exp;
                          cpu under GDN_SWEEP_INTERPRET_KERNELS=1 → splash attention through
                          Pallas's interpreter, named "… (interpreted)" (a correctness path)
    GDN        reference  chunk.py's chunk rule ("reference jax chunk rule")
               fused      the Pallas chunk rule (pallas/, "gdn_core pallas chunk rule (tpu)" /
                          "(gpu)"), composed with every CP mode through its state in and out
                          (cp/kernel_rule.py); on a CPU only under GDN_SWEEP_INTERPRET_KERNELS=1,
                          through Pallas's interpreter, "… (interpreted)"

A fused kernel that cannot serve the point raises gdn_core.kernels.KernelUnavailable with the
reason (what was asked, what it accepts); nothing falls back silently.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from .. import kernels as rules
from ..interpreted_kernels import interpret_kernels_enabled
from ..kernels import KernelUnavailable, ResolvedKernels, check_kernels
from .attention import ATTENTION_BLOCK
from .attention_fused import (CUDNN_BIND_CHECKED, SPLASH_BLOCK, SPLASH_SEGMENT_MULTIPLE,
                              cudnn_kernel, lower_cudnn_pair, splash_kernel, xla_kernel)
from .attention_pairs import PairKernel, PairKernelName, check_pair_kernel, reference_kernel

REFERENCE_ATTENTION = rules.REFERENCE_ATTENTION["jax"]
REFERENCE_GDN = rules.REFERENCE_GDN["jax"]
FUSED_ATTENTION: dict[str, PairKernelName] = {"cpu": "xla", "gpu": "cudnn", "cuda": "cudnn",
                                              "tpu": "splash"}
"""Backend (jax platform name) → the pair kernel `kernels="fused"` runs there."""
INTERPRETED_ATTENTION: dict[str, PairKernelName] = {"cpu": "splash_interpreted"}
"""Backend → the pair kernel `kernels="fused"` runs there under GDN_SWEEP_INTERPRET_KERNELS=1
(gdn_core.interpreted_kernels): splash attention through Pallas's interpreter."""
SPLASH_KERNELS = ("splash", "splash_interpreted")
DEVICE_KIND = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}
"""Backend (jax platform name) → gdn_core.kernels' device kind."""
CUDNN_PRIMITIVES = ("_dot_product_attention_fwd_p_wrapper", "_dot_product_attention_bwd_p_wrapper",
                    "check_is_flash_attention", "check_cudnn_version", "MaskType",
                    "AttentionLayout")
"""What attention_fused.py uses of jax._src.cudnn.fused_attention_stablehlo (private: looked up,
then lowered: cudnn_lowering_problem)."""


@functools.lru_cache(maxsize=None)
def pair_kernel(kernel: PairKernelName, block: int = ATTENTION_BLOCK) -> PairKernel:
    """The PairKernel named `kernel` (attention_pairs.PAIR_KERNELS), one object per
    arguments (custom VJPs take it as a static argument); `block` sizes the reference's tiles
    (the library kernels tile themselves)."""
    check_pair_kernel(kernel)
    if kernel == "reference":
        return reference_kernel(block)
    return {"xla": xla_kernel, "cudnn": cudnn_kernel, "splash": splash_kernel,
            "splash_interpreted": lambda: splash_kernel(interpret=True)}[kernel]()


def attention_pair_kernel(kernels: str, *, backend: str) -> PairKernelName:
    """The attention_pairs kernel `kernels` runs on `backend` (unchecked: see
    resolve_jax_attention_kernel)."""
    check_kernels(kernels)
    if kernels == "reference":
        return "reference"
    if backend not in FUSED_ATTENTION:
        raise KernelUnavailable(f"kernels='fused': no fused JAX attention for backend "
                                f"{backend!r}; known: {', '.join(FUSED_ATTENTION)}")
    if interpret_kernels_enabled() and backend in INTERPRETED_ATTENTION:
        return INTERPRETED_ATTENTION[backend]
    return FUSED_ATTENTION[backend]


def resolve_jax_attention_kernel(kernels: str, *, backend: str, dtype, head_dim: int,
                                 segment_len: int | None = None) -> str:
    """The attention implementation `kernels` runs on `backend` (jax platform: cpu, gpu, tpu)
    for inputs of `dtype` and `head_dim`, named with its version (gdn_core.kernels' rule book,
    which also checks dtype and head_dim); then what only this process can check: cuDNN's
    private primitives present, and splash's segment length (segment_len: the tokens of one
    segment pair, a CP chip's segment or ulysses' whole sequence; a multiple of 128 on a TPU
    and interpreted on a CPU alike: splash's blocks are). Raises KernelUnavailable
    with the reason where the fused kernel cannot serve, ValueError for an unknown
    `kernels`."""
    kernel = attention_pair_kernel(kernels, backend=backend)
    name = rules.attention_kernel_name("jax", kernels, device_kind=DEVICE_KIND[backend],
                                       dtype=np.dtype(dtype).name, head_dim=head_dim)
    if kernel == "cudnn":
        _check_cudnn_primitives()
    if kernel in SPLASH_KERNELS and segment_len is not None \
            and segment_len % SPLASH_SEGMENT_MULTIPLE:
        raise KernelUnavailable(f"{name}: splash attention needs segments of a multiple of "
                                f"{SPLASH_SEGMENT_MULTIPLE} tokens (its blocks, ≤ {SPLASH_BLOCK},"
                                f" divide them), got segment_len={segment_len} (ring and "
                                "all_gather_kv: seq_len / chips, / 2 more under zigzag; "
                                "ulysses: seq_len)")
    return name


def _check_cudnn_primitives() -> None:
    problem = cudnn_lowering_problem()
    if problem is not None:
        raise KernelUnavailable(problem)


@functools.lru_cache(maxsize=1)
def cudnn_lowering_problem() -> str | None:
    """Why the cuDNN primitives attention_fused.py binds (private to jax) do not serve this
    jax, or None: their names looked up, then one causal pair's forward and backward lowered
    for "cuda" at a small shape (attention_fused.lower_cudnn_pair), which fails when a jax
    release renames, adds or drops an operand or parameter. Once per process."""
    version = f"jax {jax.__version__}"
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn
        for name in CUDNN_PRIMITIVES:
            getattr(cudnn, name)
    except (ImportError, AttributeError) as error:
        return f"{version} lacks the cuDNN attention primitives attention_fused.py binds ({error})"
    try:
        lower_cudnn_pair("cuda")
    except Exception as error:  # noqa: BLE001 - whatever jax raises is the reason recorded
        return (f"{version}'s cuDNN attention primitives do not take what attention_fused.py "
                f"binds (written against jax {', '.join(CUDNN_BIND_CHECKED)}): lowering one "
                f"pair failed with {type(error).__name__}: {error}")
    return None


def resolve_jax_gdn_kernel(kernels: str, *, backend: str) -> str:
    """The name of the GDN rule `kernels` runs on `backend` (module docstring;
    gdn_core.kernels.jax_fused_gdn_name); KernelUnavailable where the Pallas rule cannot run."""
    check_kernels(kernels)
    return REFERENCE_GDN if kernels == "reference" else rules.jax_fused_gdn_name(backend)


def jax_gdn_rule_kernel(kernels: str, *, backend: str):
    """The one-chip rule kernel the CP GDN layers run for `kernels` on `backend`: None for the
    reference chunk rule; under fused the Pallas chunk rule bound to the backend's platform
    (a CPU: Pallas's interpreter, only under GDN_SWEEP_INTERPRET_KERNELS=1), the kernel
    protocol of cp/kernel_rule.py. KernelUnavailable where resolve_jax_gdn_kernel raises it."""
    resolve_jax_gdn_kernel(kernels, backend=backend)  # refuses what cannot run, with the reason
    if kernels == "reference":
        return None
    from .pallas import chunk_gated_delta_rule_pallas  # Pallas only where a step runs it

    return functools.partial(chunk_gated_delta_rule_pallas,
                             platform=rules.PALLAS_PLATFORMS.get(backend),
                             interpret=backend == "cpu")


def resolve_jax_kernels(kernels: str, *, backend: str, dtype, head_dim: int | None,
                        segment_len: int | None = None) -> ResolvedKernels:
    """Both resolutions; head_dim None: no attention layers (a gdn_only model). The GDN
    rule's refusal is checked first: a point it refuses is skipped with its reason alone."""
    gdn = resolve_jax_gdn_kernel(kernels, backend=backend)
    attention = None if head_dim is None else resolve_jax_attention_kernel(
        kernels, backend=backend, dtype=dtype, head_dim=head_dim, segment_len=segment_len)
    return ResolvedKernels(gdn=gdn, attention=attention)
