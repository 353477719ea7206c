"""The GDN rule as each implementation runs it: hardware FLOPs beside the model's count.

model.gdn_rule_flops is the model's cost of the rule (the standard chunked WY form, per token,
the same for every kernel). What a kernel really runs differs from it; the difference is
hardware work (executed.hardware_flops_per_step):

    reference  gdn_core's chunked rule (torch_gdn.chunk, jax_gdn.chunk). Per chunk it forms the
               affine pair of the inter-chunk recurrence, the Dk×Dk transition
               A_n = e^{G_C} I − k̃ᵀ w and b_n = k̃ᵀ u, and scans S_{n+1} = A_n S_n + b_n (the
               pairs its CP modes exchange), on N = ceil(T / C) padded chunks. A step runs
               3 × its forward, with (I + L)⁻¹ at the dense-apply convention here and as each
               framework really runs it in executed.solve_flops.
    fused      flash-linear-attention's chunk_gated_delta_rule (torch, kernels="fused"), WY form:
               its forward builds (I + L)⁻¹ blockwise (solve_tril), its backward recomputes
               w, u and the chunk states before its own gradient kernels (fla_block_macs).

    pallas     this project's Pallas chunk rule (jax_gdn.pallas: JAX under kernels="fused"), in
               the WY form: (I + L)⁻¹ by blockwise merges from 1×1 blocks, and a backward that
               recomputes each chunk's forward and differentiates it (pallas_block_macs).

Both fused kernels compose with the CP exchanges through their state in and out; the extra
summary call at width K+V is CP work (executed.cp_overhead_flops).
Conventions and letters: the package docstring (gdn_core.flops).
"""

from __future__ import annotations

import dataclasses
import math

from ..kernels import check_kernels
from ..train_config import check_framework
from .conventions import FLOPS_PER_MAC, FWD_BWD_MULTIPLIER, check_chunk, check_positive, sum_fields
from .model import gdn_rule_flops

GDN_KERNELS = ("reference", "fused", "pallas")
"""The GDN rule implementations a step can run (gdn_kernel's answers): ours, fla's, our Pallas
rule."""


def gdn_kernel(kernels: str, framework: str) -> str:
    """The GDN rule implementation a step of `framework` runs under the sweep's `kernels`:
    the reference rule, or under "fused" fla's rule (torch) or the Pallas rule (JAX)."""
    check_kernels(kernels)
    check_framework(framework)
    if kernels == "reference":
        return "reference"
    return "fused" if framework == "torch" else "pallas"


def check_gdn_kernel(kernel: str) -> None:
    if kernel not in GDN_KERNELS:
        raise ValueError(f"gdn_kernel={kernel!r} is not one of: {', '.join(GDN_KERNELS)}")


# --------------------------------------------------------------------------- reference

@dataclasses.dataclass(frozen=True, slots=True)
class ReferenceRuleFlops:
    """Forward FLOPs of gdn_core's chunked rule, one field per matmul (B · Hv · N blocks)."""

    gram: int
    """L = (β k) kᵀ inside each chunk: C·C·Dk MACs per chunk (full block, as computed)."""
    intra_chunk_attn: int
    """q kᵀ inside each chunk: C·C·Dk MACs per chunk."""
    triangular_solve: int
    """(I + L)⁻¹ applied to [β v | β k e^G]: counted as C·C·(Dv + Dk) MACs per chunk."""
    chunk_a: int
    """The Dk×Dk transition A_n = e^{G_C} I − k̃ᵀ w: Dk·C·Dk MACs per chunk."""
    chunk_b: int
    """b_n = k̃ᵀ u: Dk·C·Dv MACs per chunk."""
    state_scan: int
    """S_{n+1} = A_n S_n + b_n: Dk·Dk·Dv MACs per chunk (all N chunks are scanned)."""
    outputs: int
    """w S_n, q̃ S_n (C·Dk·Dv each) and attn (u − w S_n) (C·C·Dv) per chunk."""

    @property
    def total(self) -> int:
        return sum_fields(self)


def reference_rule_flops(*, batch: int, seq_len: int, num_k_heads: int, num_v_heads: int,
                         head_k_dim: int, head_v_dim: int,
                         chunk_size: int) -> ReferenceRuleFlops:
    """Count the forward FLOPs of gdn_core's chunked rule as it runs, matmul by matmul.

    Per chunk and value head (C, Dk, Dv), MACs:

        gram            C²·Dk          intra-chunk attn   C²·Dk
        (I+L)⁻¹ applied C²·(Dv + Dk)   A_n               C·Dk²      b_n   C·Dk·Dv
        state scan      Dk²·Dv         outputs           2·C·Dk·Dv + C²·Dv

    over the N = ceil(T / C) chunks the code pads to. Against the model's standard form it
    runs A_n (C·Dk²) and the state scan (Dk²·Dv) in place of the state update (C·Dk·Dv, the
    b_n here), and the padding. The solve is counted as applying a dense C×C matrix (the
    model's convention); executed.solve_flops replaces it by what each framework runs.
    """
    gdn_rule_flops(batch=batch, seq_len=seq_len, num_k_heads=num_k_heads,
                   num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
                   chunk_size=chunk_size)  # the same argument checks
    C, K, V = chunk_size, head_k_dim, head_v_dim
    blocks = batch * num_v_heads * math.ceil(seq_len / C)  # (batch row, head, chunk) blocks
    per_block = {
        "gram": C * C * K,
        "intra_chunk_attn": C * C * K,
        "triangular_solve": C * C * (V + K),
        "chunk_a": K * C * K,
        "chunk_b": K * C * V,
        "state_scan": K * K * V,
        "outputs": 2 * C * K * V + C * C * V,
    }
    return ReferenceRuleFlops(**{name: FLOPS_PER_MAC * blocks * macs
                                 for name, macs in per_block.items()})


def reference_macs_per_block(chunk_size: int, head_k_dim: int, head_v_dim: int) -> int:
    """Forward MACs of one (batch row, head, chunk) block of the reference rule."""
    C, K, V = chunk_size, head_k_dim, head_v_dim
    return C * C * (3 * K + 2 * V) + C * K * K + 3 * C * K * V + K * K * V


# --------------------------------------------------------------------------- fused (fla)

SUB = 16
"""fla builds (I + L)⁻¹ from 16×16 diagonal blocks."""


@dataclasses.dataclass(frozen=True, slots=True)
class FlaBlockMacs:
    """MACs of one (batch row, value head, chunk) block of fla's chunk_gated_delta_rule, by
    kernel, as fla-org/flash-linear-attention runs it (at its commit bc3b101)."""

    kkt: int
    """Forward, fused kkt + solve_tril: β k kᵀ on the n·(n + 1)/2 lower 16×16 sub-blocks of
    the chunk (n = C/16): n·(n + 1)/2 · 16² · Dk."""
    inverse: int
    """Forward, (I + L)⁻¹: each 16×16 diagonal block by substitution (15 rows of 16 × 16),
    then the off-diagonal blocks by block substitution, Σ_{d=1}^{n−1} (n − d)·(d + 1)
    products of 16³ (16 at C = 64)."""
    wy: int
    """Forward, recompute_w_u: w and u, C²·(Dk + Dv)."""
    states: int
    """Forward, chunk_gated_delta_rule_fwd_h: u − w S and S's update, 2·C·Dk·Dv."""
    outputs: int
    """Forward, chunk_fwd_o: q S (C·Dk·Dv), q kᵀ (C²·Dk), attn · v_new (C²·Dv)."""
    recompute: int
    """Backward: w, u and the chunk states again, C²·(Dk + Dv) + 2·C·Dk·Dv."""
    dv_local: int
    """Backward, chunk_bwd_dv_local: k qᵀ (C²·Dk) and its product with dO (C²·Dv)."""
    dstates: int
    """Backward, chunk_gated_delta_rule_bwd_dhu: dv += k dS, dS += qᵀ dO − wᵀ dv: 3·C·Dk·Dv."""
    dqkw: int
    """Backward, chunk_bwd_dqkwg: dO vᵀ (C²·Dv); dO S, v dS, dv S (3·C·Dk·Dv); ds k and
    dsᵀ q (2·C²·Dk)."""
    dwy: int
    """Backward, prepare_wy_repr_bwd: dA from dw, du and the products with A (2·C²·Dk +
    2·C²·Dv), through the inverse, Aᵀ dA Aᵀ (2·C³), then β k kᵀ again and dk from dA
    (3·C²·Dk)."""

    @property
    def forward(self) -> int:
        return self.kkt + self.inverse + self.wy + self.states + self.outputs

    @property
    def total(self) -> int:
        """Forward + backward."""
        return sum_fields(self)


def fla_block_macs(chunk_size: int, head_k_dim: int, head_v_dim: int) -> FlaBlockMacs:
    """Count one block of fla's chunk_gated_delta_rule, forward and backward (see the class).

    Against the model's standard form (3 × C²·(3·Dk + 2·Dv) + 3·C·Dk·Dv per step) it adds
    building the inverse, its backward's recomputation and the inverse's VJP, and saves the
    upper sub-blocks of β k kᵀ in forward.
    """
    check_chunk(chunk_size)
    check_positive(head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    C, K, V, n = chunk_size, head_k_dim, head_v_dim, chunk_size // SUB
    merges = sum((n - d) * (d + 1) for d in range(1, n))
    return FlaBlockMacs(
        kkt=n * (n + 1) // 2 * SUB * SUB * K,
        inverse=n * (SUB - 1) * SUB * SUB + merges * SUB ** 3,
        wy=C * C * (K + V),
        states=2 * C * K * V,
        outputs=C * K * V + C * C * K + C * C * V,
        recompute=C * C * (K + V) + 2 * C * K * V,
        dv_local=C * C * K + C * C * V,
        dstates=3 * C * K * V,
        dqkw=C * C * V + 3 * C * K * V + 2 * C * C * K,
        dwy=5 * C * C * K + 2 * C * C * V + 2 * C ** 3,
    )


# --------------------------------------------------------------------------- pallas (ours)

@dataclasses.dataclass(frozen=True, slots=True)
class PallasBlockMacs:
    """MACs of one (batch row, value head, chunk) block of the Pallas chunk rule, as
    jax_gdn.pallas.chunk_math writes it (chunk_forward, chunk_backward; the GPU
    parameterisation groups the same products into its three calls a direction)."""

    products: int
    """Forward, every product but the inverse: β k kᵀ and q kᵀ (2·C²·Dk), w = T(β k e^G)
    (C²·Dk), u = T(β v) (C²·Dv), attn · v_new (C²·Dv), w S, q̃ S and the state's kᵀ v_new
    (3·C·Dk·Dv)."""
    inverse: int
    """Forward, (I + L)⁻¹ by merges from 1×1 blocks: 2·log2(C) products of C×C by C×C."""
    recompute: int
    """Backward: the chunk's forward again (products + inverse)."""
    products_vjp: int
    """Backward: each forward product's two operand cotangents (2 × products)."""
    inverse_vjp: int
    """Backward: dL = −Tᵀ dT Tᵀ, 2·C³."""

    @property
    def forward(self) -> int:
        return self.products + self.inverse

    @property
    def total(self) -> int:
        """Forward + backward."""
        return sum_fields(self)


def pallas_block_macs(chunk_size: int, head_k_dim: int, head_v_dim: int) -> PallasBlockMacs:
    """Count one block of the Pallas chunk rule, forward and backward (see the class)."""
    check_chunk(chunk_size)
    check_positive(head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    C, K, V = chunk_size, head_k_dim, head_v_dim
    products = 3 * C * C * K + 2 * C * C * V + 3 * C * K * V
    inverse = 2 * int(math.log2(C)) * C ** 3
    return PallasBlockMacs(products=products, inverse=inverse, recompute=products + inverse,
                           products_vjp=2 * products, inverse_vjp=2 * C ** 3)


def fused_block_macs(kernel: str, chunk_size: int, head_k_dim: int,
                     head_v_dim: int) -> FlaBlockMacs | PallasBlockMacs:
    """The block count of a fused kernel ("fused": fla's, "pallas": ours)."""
    counts = {"fused": fla_block_macs, "pallas": pallas_block_macs}
    if kernel not in counts:
        raise ValueError(f"kernel={kernel!r} is not a fused GDN kernel: one of "
                         f"{', '.join(counts)}")
    return counts[kernel](chunk_size, head_k_dim, head_v_dim)


# --------------------------------------------------------------------------- any kernel

def rule_block_macs(kernel: str, *, chunk_size: int, head_k_dim: int,
                    head_v_dim: int) -> tuple[int, int]:
    """(forward, forward + backward) MACs of one (batch row, value head, chunk) block as
    `kernel` (GDN_KERNELS) runs it; the reference's (I + L)⁻¹ at the dense-apply convention,
    its backward 2 × its forward (executed.solve_flops adds each framework's own solve work);
    a fused kernel's own inverse in its count."""
    check_gdn_kernel(kernel)
    if kernel != "reference":
        fused = fused_block_macs(kernel, chunk_size, head_k_dim, head_v_dim)
        return fused.forward, fused.total
    forward = reference_macs_per_block(chunk_size, head_k_dim, head_v_dim)
    return forward, FWD_BWD_MULTIPLIER * forward


@dataclasses.dataclass(frozen=True, slots=True)
class RuleFlops:
    """A step's GDN rule as its kernel runs it, against the model's count of it (global batch,
    all GDN layers, forward + backward), on the unsharded blocks B·Hv·ceil(T/C) per layer:
    what splitting the sequence adds is CP work (executed.cp_overhead_flops)."""

    kernel: str
    """The implementation that runs (GDN_KERNELS)."""
    ran: int
    """Forward + backward as it runs (the reference's solve at the dense-apply convention)."""
    ran_forward: int
    """The forward alone: what remat recomputes."""
    counted: int
    """model_flops_per_step's gdn_rule: 3 × the standard form's forward."""

    @property
    def total(self) -> int:
        """What hardware FLOPs add to the model count for the rule (ran − counted)."""
        return self.ran - self.counted


def rule_flops(kernel: str, *, batch: int, seq_len: int, num_k_heads: int, num_v_heads: int,
               head_k_dim: int, head_v_dim: int, chunk_size: int,
               num_layers: int) -> RuleFlops:
    """Count a step's GDN rule as `kernel` runs it, beside the model's count (RuleFlops)."""
    check_positive(num_layers=num_layers)
    model = gdn_rule_flops(batch=batch, seq_len=seq_len, num_k_heads=num_k_heads,
                           num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                           head_v_dim=head_v_dim, chunk_size=chunk_size).total
    forward, step = rule_block_macs(kernel, chunk_size=chunk_size, head_k_dim=head_k_dim,
                                    head_v_dim=head_v_dim)
    blocks = batch * num_v_heads * math.ceil(seq_len / chunk_size) * num_layers
    return RuleFlops(kernel=kernel, ran=FLOPS_PER_MAC * blocks * step,
                     ran_forward=FLOPS_PER_MAC * blocks * forward,
                     counted=FWD_BWD_MULTIPLIER * model * num_layers)


__all__ = ["FlaBlockMacs", "GDN_KERNELS", "PallasBlockMacs", "ReferenceRuleFlops", "RuleFlops",
           "check_gdn_kernel", "fla_block_macs", "fused_block_macs", "gdn_kernel",
           "pallas_block_macs", "reference_macs_per_block",
           "reference_rule_flops", "rule_block_macs", "rule_flops"]
