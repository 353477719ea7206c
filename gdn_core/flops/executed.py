"""hardware_flops_per_step: the FLOPs a step executes, beyond the model count (HFU's numerator).

model_flops_per_step (model.py) plus, as each framework and kernel runs them: the GDN rule as
its kernel runs it in place of the model's standard form (rule.py: the reference rule's Dk×Dk
transitions and state scan and its chunk padding, or fla's inverse and recomputation), the CP
modes' extra work over the single-chip rule (fold, prefix, state application, shard padding),
what remat and the chunked loss recompute, the reference's (I + L)⁻¹ work in place of the
dense-apply convention, and the pairs attention CP computes beyond the causal count
(attention.py). Under packed documents (cu_seqlens) the model part counts attention per
document, and the pairs attention CP computes beyond them are not counted: the kernels skip
the pairs between documents, and what they still compute inside a visible pair depends on the
framework (torch cuts pairs to the visible sub-pairs, JAX masks a partly visible pair whole),
so HFU is a lower bound there rather than an overcount that could pass 1.
Conventions and letters: the package docstring (gdn_core.flops).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..config import ModelConfig
from ..cp_layout import check_layout
from ..cp_modes import check_attention_cp_shape, check_cp_shape, check_mode
from ..train_config import check_framework
from .attention import attention_cp_extra_flops
from .conventions import (FLOPS_PER_MAC, FWD_BWD_MULTIPLIER, check_chunk, check_positive,
                          sum_fields)
from .model import ModelFlops, layer_counts, model_flops_per_step, model_forward_flops
from .rule import (RuleFlops, check_gdn_kernel, fused_block_macs, gdn_kernel, rule_block_macs,
                   rule_flops)


def unit_lower_inverse_flops(*, batch: int, seq_len: int, num_v_heads: int,
                             chunk_size: int) -> int:
    """Forward FLOPs the JAX rule spends building (I + L)⁻¹ explicitly (not in model FLOPs).

    As gdn_core.jax_gdn.chunk runs it: forward substitution on each 16×16 diagonal block, 15
    row steps of a 16-vector times a 16×16 block (240·16 MACs per block, C/16 blocks), then
    merges 16→32→…→C, each inv([[A,0],[X,B]]) = [[A⁻¹,0],[−B⁻¹XA⁻¹,B⁻¹]] two s×s×s matmuls:
    Σ_s (C/2s)·2s³ = C·(C² − 256)/3 MACs. Per chunk and value head: 240·C + C·(C² − 256)/3.
    Applying the inverse is already counted as `triangular_solve`. (The product form it
    replaced took 2·(log2 C − 1)·C³, 27× more at C = 64.)
    """
    check_positive(batch=batch, seq_len=seq_len, num_v_heads=num_v_heads)
    check_chunk(chunk_size)
    C = chunk_size
    blocks = batch * num_v_heads * math.ceil(seq_len / C)
    return FLOPS_PER_MAC * blocks * (240 * C + C * (C * C - 256) // 3)


@dataclasses.dataclass(frozen=True, slots=True)
class CPOverheadFlops:
    """Extra FLOPs of a CP mode over the single-chip rule, summed over chips, forward + backward."""

    fold: int
    """Each chip's (A, b) pair: reference, composing its chunk pairs, D·(n − 1) compositions;
    a fused kernel (fla, or the Pallas rule), its summary call (values [0 | v] of width K+V
    from initial state [I | 0]: torch_gdn.cp.kernel_rule, jax_gdn.cp.kernel_rule), D·n blocks
    at head_v_dim K+V as the kernel runs them."""
    prefix: int
    """Turning the exchanged pairs into each chip's incoming state (all_gather, log_scan)."""
    state_apply: int
    """One A·h + b per chip: the incoming map (p2p: the chip's own pair) applied to a state."""
    shard_padding: int
    """Rule work on chunks added by padding each shard, not the whole sequence, to C tokens."""
    shard_padding_forward: int = 0
    """The forward part of shard_padding (what remat recomputes); not added to total."""
    fold_forward: int | None = None
    """The forward part of fold where its backward is not two forwards (a fused kernel's
    summary call); None: fold / 3. Not added to total."""

    @property
    def total(self) -> int:
        return self.fold + self.prefix + self.state_apply + self.shard_padding

    @property
    def forward(self) -> int:
        """The forward part: a third of the exchanges' work (fold, prefix, state_apply: their
        backward is two forwards), the shard padding's forward as its kernel runs it."""
        fold_forward = (self.fold // FWD_BWD_MULTIPLIER if self.fold_forward is None
                        else self.fold_forward)
        return ((self.prefix + self.state_apply) // FWD_BWD_MULTIPLIER + fold_forward
                + self.shard_padding_forward)


def cp_overhead_flops(mode: str, *, chips: int, batch: int, seq_len: int, num_v_heads: int,
                      head_k_dim: int, head_v_dim: int, chunk_size: int, num_layers: int,
                      kernel: str = "reference") -> CPOverheadFlops:
    """Count the work a CP mode adds on top of the single-chip rule (× 3 for forward + backward).

    seq_len is the global sequence; each of the D = chips chips holds T/D tokens in
    n = ceil(T / D / C) chunks. Per batch row, value head and layer, composing two affine maps
    (A·A' and A·b' + b) is Dk³ + Dk²·Dv MACs; applying one to a state (A·h + b) is Dk²·Dv.
    Counted as gdn_core's CP modes run them (torch_gdn/cp, jax_gdn/cp), summed over chips:
        fold          p2p, all_gather, log_scan  D·(n − 1) compositions (fold_chunk_pairs)
        prefix        all_gather                 D·(D − 1) applications: every chip runs the
                                                 gathered pairs over the state (the JAX scan
                                                 visits all D positions; torch stops at its own
                                                 rank unless the final state is asked for)
                      log_scan                   D·2·(ceil(log2 D) − 1) compositions: per
                                                 Hillis–Steele round after the first, one into
                                                 the exclusive and one into the sent pair (JAX
                                                 computes them on every chip under a mask;
                                                 torch skips chips that received nothing)
        state_apply   p2p, all_gather, log_scan  D applications, one per chip
        shard_padding p2p, all_gather, log_scan  rule MACs of the D·n − ceil(T / C) chunks that
                                                 padding each shard adds, as `kernel` runs a
                                                 block (rule.rule_block_macs)
    Where the implementations differ the larger count is taken, except that JAX p2p also
    computes A·h + b on every chip in each of its D − 1 rounds and discards all but one (not
    counted; Dk²·Dv each, small next to the fold). ulysses splits heads, not the sequence: no
    overhead. chips == 1 runs the single-chip rule: no overhead. The exchanges are ours under
    either kernel; with a fused kernel ("fused": fla, "pallas": ours) the fold is its summary
    call instead (one call per chip at head_v_dim K+V, its discarded output included: neither
    has a state-only call), and the incoming state feeds the kernel's call through
    initial_state (the shard's rule: not overhead).
    """
    check_mode(mode)
    check_gdn_kernel(kernel)
    check_positive(chips=chips, batch=batch, seq_len=seq_len, num_v_heads=num_v_heads,
                   head_k_dim=head_k_dim, head_v_dim=head_v_dim, num_layers=num_layers)
    check_chunk(chunk_size)
    if seq_len % chips:
        raise ValueError(f"seq_len={seq_len} is not divisible by chips={chips}")
    if mode == "ulysses" or chips == 1:
        return CPOverheadFlops(fold=0, prefix=0, state_apply=0, shard_padding=0)
    D, K, V, C = chips, head_k_dim, head_v_dim, chunk_size
    local_chunks = math.ceil(seq_len // D / C)
    compose_macs, apply_macs = K * K * K + K * K * V, K * K * V
    prefix_macs = {
        "p2p": 0,
        "all_gather": D * (D - 1) * apply_macs,
        "log_scan": D * 2 * (math.ceil(math.log2(D)) - 1) * compose_macs,
    }[mode]
    extra_chunks = D * local_chunks - math.ceil(seq_len / C)
    block_forward, block_step = rule_block_macs(kernel, chunk_size=C, head_k_dim=K,
                                                head_v_dim=V)
    per_row = FLOPS_PER_MAC * batch * num_v_heads * num_layers
    scale = FWD_BWD_MULTIPLIER * per_row
    fold, fold_forward = scale * D * (local_chunks - 1) * compose_macs, None
    if kernel != "reference":
        summary = fused_block_macs(kernel, C, K, K + V)
        fold = per_row * D * local_chunks * summary.total
        fold_forward = per_row * D * local_chunks * summary.forward
    return CPOverheadFlops(
        fold=fold, fold_forward=fold_forward,
        prefix=scale * prefix_macs,
        state_apply=scale * D * apply_macs,
        shard_padding=per_row * extra_chunks * block_step,
        shard_padding_forward=per_row * extra_chunks * block_forward,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RecomputeFlops:
    """Forward work a step runs a second time in backward (global batch, one step)."""

    layers: int
    """remat 'full': every decoder layer's forward (GDN or attention layer + MLP, CP work
    included); 'gdn': every GDN core's forward (conv and rule, its CP work included); 'none': 0.
    The rule's forward as its kernel runs it (rule.RuleFlops.ran_forward)."""
    lm_head: int
    """The chunked cross-entropy recomputes each token chunk's logits in backward: one more
    LM-head forward."""

    @property
    def total(self) -> int:
        return sum_fields(self)


def recompute_flops(model_cfg: ModelConfig, *, remat: str, batch: int, seq_len: int,
                    cp_overhead: CPOverheadFlops, rule_forward: int,
                    attention_cp: int = 0,
                    cu_seqlens: Sequence[int] | None = None) -> RecomputeFlops:
    """Count what `remat` and the chunked loss recompute; cp_overhead is the step's GDN CP
    work, rule_forward the rule's forward as its kernel runs it (all GDN layers) and
    attention_cp the attention layers' CP work (fwd + bwd, so its forward is a
    FWD_BWD_MULTIPLIER-th); cu_seqlens the packed documents (model_forward_flops)."""
    if remat not in ("none", "full", "gdn"):
        raise ValueError(f"remat={remat!r} is not one of: none, full, gdn")
    forward = model_forward_flops(model_cfg, batch=batch, seq_len=seq_len, cu_seqlens=cu_seqlens)
    cp_forward = cp_overhead.forward
    layers = {
        "none": 0,
        "full": rule_forward + forward.gdn_projections + forward.conv + forward.mlp
        + forward.attention_projections + forward.attention_core + cp_forward
        + attention_cp // FWD_BWD_MULTIPLIER,
        "gdn": rule_forward + forward.conv + cp_forward,
    }[remat]
    return RecomputeFlops(layers=layers, lm_head=forward.lm_head)


@dataclasses.dataclass(frozen=True, slots=True)
class SolveFlops:
    """The reference rule's (I + L)⁻¹ applied to [β v | β k e^G] as a framework runs it,
    against the dense-apply convention the model and rule counts use for it.

    total = ran − counted: what hardware FLOPs add to the dense-apply convention (negative for
    torch, whose triangular solve does less than a dense apply). All 0 under the fused
    kernels, whose counts hold their own inverse (rule.fused_block_macs).
    """

    framework: str
    ran_forward: int
    """Forward, every rule block the step runs (padded shard chunks included)."""
    ran_backward: int
    ran_recompute: int
    """The forward again where remat recomputes the rule (gdn, full); else 0."""
    counted: int
    """What the rule count, CP shard padding and recompute count for it: C²·(Dv + Dk) MACs per
    block and forward, × 3 for forward + backward, + 1 forward where recomputed."""

    @property
    def total(self) -> int:
        return self.ran_forward + self.ran_backward + self.ran_recompute - self.counted


def solve_flops(framework: str, *, mode: str, chips: int, batch: int, seq_len: int,
                num_v_heads: int, head_k_dim: int, head_v_dim: int, chunk_size: int,
                num_layers: int, remat: str) -> SolveFlops:
    """Count the step's (I + L)⁻¹ work as `framework` runs it (global batch, all layers).

    Per (batch row, value head, chunk) block, with R = Dk + Dv right-hand sides (MACs):
        jax    forward   unit_lower_inverse (240·C + C·(C² − 256)/3) + apply T·rhs C²·R
               backward  apply: dT and d(rhs) C²·R each; the inverse's VJP −Tᵀ dT Tᵀ 2·C³
        torch  forward   solve_triangular, unit lower: C·(C − 1)/2 per rhs, C·(C − 1)/2·R
               backward  d(rhs): the transposed solve C·(C − 1)/2·R; dL = −d(rhs)·Xᵀ, a dense
                         C×R×C product C²·R (torch's linalg_solve_triangular_backward)
    A recomputed rule (remat gdn, full) runs its forward again. Blocks: ceil(T/C) per row and
    head (one chip, ulysses), or D·ceil(T/D/C) when the sequence is split (shard padding).
    """
    check_framework(framework)
    if remat not in ("none", "full", "gdn"):
        raise ValueError(f"remat={remat!r} is not one of: none, full, gdn")
    check_mode(mode)
    check_positive(chips=chips, batch=batch, seq_len=seq_len, num_v_heads=num_v_heads,
                   head_k_dim=head_k_dim, head_v_dim=head_v_dim, num_layers=num_layers)
    check_chunk(chunk_size)
    C, R = chunk_size, head_k_dim + head_v_dim
    chunks = (math.ceil(seq_len / C) if mode == "ulysses" or chips == 1
              else chips * math.ceil(seq_len // chips / C))
    blocks = batch * num_v_heads * chunks * num_layers
    apply_macs = C * C * R
    if framework == "jax":
        forward = 240 * C + C * (C * C - 256) // 3 + apply_macs
        backward = 2 * apply_macs + 2 * C ** 3
    else:
        solve = C * (C - 1) // 2 * R
        forward = solve
        backward = solve + apply_macs
    recomputed = remat in ("gdn", "full")
    counted = (FWD_BWD_MULTIPLIER + recomputed) * apply_macs
    scale = FLOPS_PER_MAC * blocks
    return SolveFlops(framework=framework, ran_forward=scale * forward,
                      ran_backward=scale * backward,
                      ran_recompute=scale * forward if recomputed else 0,
                      counted=scale * counted)


@dataclasses.dataclass(frozen=True, slots=True)
class HardwareFlops:
    """hardware_flops_per_step from the analytical count: model FLOPs, the rule as its kernel
    runs it, the CP work, what recomputation runs again, and the reference rule's (I + L)⁻¹
    work as its framework runs it in place of the dense-apply convention."""

    model: ModelFlops
    rule: RuleFlops
    cp_overhead: CPOverheadFlops
    recompute: RecomputeFlops
    solve: SolveFlops
    attention_cp: int = 0
    """Hybrid decoder: pairs attention CP computes beyond the causal count
    (attention.attention_cp_extra_flops), fwd + bwd, all attention layers; 0 under packed
    documents (not modelled: the module docstring)."""

    @property
    def total(self) -> int:
        return (self.model.total + self.rule.total + self.cp_overhead.total
                + self.recompute.total + self.solve.total + self.attention_cp)


def hardware_flops_per_step(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int,
                            seq_len: int, framework: str, remat: str = "none",
                            attn_cp: str = "all_gather_kv", layout: str = "contiguous",
                            kernels: str = "reference",
                            cu_seqlens: Sequence[int] | None = None) -> HardwareFlops:
    """Count a step's FLOPs as run under CP `mode` on `chips` chips (global batch, fwd + bwd),
    recomputation under `remat` and the chunked loss included (HFU rises with remat, MFU not),
    the GDN rule as `kernels` runs it on `framework` ("jax" or "torch", required: they run
    different work; rule.gdn_kernel: fla's rule on torch, the Pallas rule on JAX), with the
    reference rule's (I + L)⁻¹ as `framework` runs it; a hybrid decoder's attention layers under `attn_cp` in
    `layout`, counted alike for both kernels (the causal pairs plus what attention CP computes
    beyond them). The GDN CP work is counted for contiguous shards under either layout
    (zigzag's second segment per chip adds one state composition per chip and layer, not
    counted). cu_seqlens: the packed documents of every row, as model_flops_per_step takes
    them (attention CP's extra pairs then uncounted: the module docstring).

    Raises ValueError, like the CP modes, for a shape `mode`, `attn_cp` or `layout` cannot
    split over `chips`.
    """
    kernel = gdn_kernel(kernels, framework)
    gdn, (gdn_layers, attention_layers) = model_cfg.gdn, layer_counts(model_cfg)
    check_cp_shape(mode=mode, chips=chips, seq_len=seq_len, num_k_heads=gdn.num_k_heads,
                   num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size)
    check_layout(layout, chips=chips, seq_len=seq_len)
    attention_cp = 0
    if attention_layers:
        a = model_cfg.attention
        check_attention_cp_shape(attn_cp=attn_cp, chips=chips, num_heads=a.num_heads)
        if cu_seqlens is None:  # packed documents: not modelled (the module docstring)
            attention_cp = attention_cp_extra_flops(
                attn_cp, chips=chips, batch=batch, seq_len=seq_len, num_heads=a.num_heads,
                head_dim=a.head_dim, num_layers=attention_layers, layout=layout)
    no_solve = SolveFlops(framework=framework, ran_forward=0, ran_backward=0, ran_recompute=0,
                          counted=0)
    if gdn_layers == 0:  # every layer full attention (full_attention_interval 1)
        rule = RuleFlops(kernel=kernel, ran=0, ran_forward=0, counted=0)
        overhead = CPOverheadFlops(fold=0, prefix=0, state_apply=0, shard_padding=0)
        solve = no_solve
    else:
        shape = dict(batch=batch, seq_len=seq_len, num_v_heads=gdn.num_v_heads,
                     head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim,
                     chunk_size=gdn.chunk_size, num_layers=gdn_layers)
        rule = rule_flops(kernel, num_k_heads=gdn.num_k_heads, **shape)
        overhead = cp_overhead_flops(mode, chips=chips, kernel=kernel, **shape)
        # a fused kernel's inverse and its apply are in its own count (rule.fused_block_macs)
        solve = (no_solve if kernel != "reference" else
                 solve_flops(framework, mode=mode, chips=chips, remat=remat, **shape))
    recompute = recompute_flops(model_cfg, remat=remat, batch=batch, seq_len=seq_len,
                                cp_overhead=overhead, rule_forward=rule.ran_forward,
                                attention_cp=attention_cp, cu_seqlens=cu_seqlens)
    model = model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len, cu_seqlens=cu_seqlens)
    return HardwareFlops(model=model,
                         rule=rule, cp_overhead=overhead, recompute=recompute, solve=solve,
                         attention_cp=attention_cp)


__all__ = ["CPOverheadFlops", "HardwareFlops", "RecomputeFlops", "SolveFlops",
           "cp_overhead_flops", "hardware_flops_per_step", "recompute_flops", "solve_flops",
           "unit_lower_inverse_flops"]
