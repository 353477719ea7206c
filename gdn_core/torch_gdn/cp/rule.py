"""`chunk_gated_delta_rule_cp`: validate at the boundary, then run the mode from `CP_RULES`."""

from __future__ import annotations

from ...cp_layout import Layout
from ...cp_modes import CPMode, check_cp_shape
from ...kernels import KernelUnavailable
from ...shapes import check_rule_args
from ..chunk import chunk_gated_delta_rule, initial_state_or_zeros
from ..documents import check_cu_seqlens, document_starts
from .all_gather import chunk_gated_delta_rule_all_gather
from .comm import rank_size
from .common import CPRule, shard_positions_tensor
from .kernel_rule import chunk_gated_delta_rule_kernel_cp
from .log_scan import chunk_gated_delta_rule_log_scan
from .p2p import chunk_gated_delta_rule_p2p
from .ulysses import chunk_gated_delta_rule_ulysses

CP_RULES: dict[str, CPRule] = {
    "ulysses": chunk_gated_delta_rule_ulysses,
    "p2p": chunk_gated_delta_rule_p2p,
    "all_gather": chunk_gated_delta_rule_all_gather,
    "log_scan": chunk_gated_delta_rule_log_scan,
}


def chunk_gated_delta_rule_cp(q, k, v, g, beta, *, group, mode: CPMode,
                              layout: Layout = "contiguous", initial_state=None,
                              output_final_state=False, use_qk_l2norm=False, chunk_size=64,
                              kernel=None, cu_seqlens=None):
    """Gated delta rule over a sequence split across the ranks of `group` (context parallel).

    Args:
        q, k: this rank's shard [B, T/D, Hk, Dk]; v [B, T/D, Hv, Dv]; g (log decay ≤ 0) and
            beta [B, T/D, Hv]. Rank r of `group` holds tokens [r·T/D, (r+1)·T/D).
        group: the CP process group (gloo or NCCL); None means the default group.
        mode: one of CP_MODES ('ulysses', 'p2p', 'all_gather', 'log_scan').
        layout: 'contiguous' (above) or 'zigzag' (gdn_core.cp_layout): the shard is then
            segments r and 2D−1−r of 2D, in that order ([B, 2s, …], s = T/(2D)); o comes back
            in the same local order. Every mode serves both, with no re-shard.
        initial_state: [B, Hv, Dk, Dv], the same on every rank: the state before token 0.
        use_qk_l2norm, chunk_size: as in chunk_gated_delta_rule.
        kernel: None, this package's rule (its chunk pairs folded and replayed around the
            exchange: common.py); or a gdn_kernels.GDNRuleKernel (fla-core's under
            kernels="fused", its own chunk size) composed through its public call alone
            (kernel_rule.py; ulysses: one call on the rank's heads); or fla's own CP
            (gdn_kernels.FlaCPContextKernel, all_gather only: fla's cp_context).
        cu_seqlens: None, or the GLOBAL packed-document boundaries (int [N+1], 0 … T, all rows;
            the same on every rank), as in chunk_gated_delta_rule: each rank finds the starts
            in its own tokens (its layout's positions). A document may span ranks (its state
            crosses); a shard holding a start passes on nothing from before it.
    On one rank (D = 1) no CP machinery runs: one call of the one-chip rule (or of `kernel`)
    from initial_state.
    Returns:
        o: this rank's shard [B, T/D, Hv, Dv] in q's dtype, and, if asked, the float32 state
        after the whole global sequence [B, Hv, Dk, Dv], identical on every rank.
    Raises:
        ValueError naming the numbers: unknown mode or layout, bad shapes, a global sequence
        not divisible by 2D under zigzag, ulysses with value heads not divisible by D (fewer
        key heads than ranks is fine: they are copied).

    Backward exchanges too (the forward's exchange in reverse). Every rank must backpropagate
    through o, and through final_state on all ranks or on none: a rank whose loss skips it
    would skip a collective its peers wait for.
    """
    B, T_local, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape,
        None if initial_state is None else initial_state.shape, chunk_size)
    _, D = rank_size(group)
    check_cp_shape(mode=mode, chips=D, seq_len=T_local * D, num_k_heads=Hk, num_v_heads=Hv,
                   layout=layout)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T_local * D)
    if D == 1:  # the whole sequence, in order under either layout: the one-chip rule
        documents = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        if kernel is None:
            o, final_BHKV = chunk_gated_delta_rule(
                q, k, v, g, beta, initial_state=initial_state,
                output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm,
                chunk_size=chunk_size, **documents)
        else:
            o, final_BHKV = kernel(q, k, v, g, beta, initial_state=initial_state,
                                   output_final_state=output_final_state,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm, **documents)
        return o.to(q.dtype), final_BHKV
    h0_BHKV = initial_state_or_zeros(initial_state, B, Hv, Dk, Dv, q.device)
    args = dict(group=group, h0_BHKV=h0_BHKV, output_final_state=output_final_state,
                use_qk_l2norm=use_qk_l2norm, layout=layout)
    if kernel is None and mode == "ulysses":  # the sequence is whole there: global boundaries
        o, final_BHKV = CP_RULES[mode](q, k, v, g, beta, chunk_size=chunk_size,
                                       cu_seqlens=cu_seqlens, **args)
    elif kernel is None:
        doc_starts_t = None if cu_seqlens is None else document_starts(
            cu_seqlens, shard_positions_tensor(group=group, seq_len=T_local * D, layout=layout,
                                               device=q.device))
        o, final_BHKV = CP_RULES[mode](q, k, v, g, beta, chunk_size=chunk_size,
                                       doc_starts_t=doc_starts_t, **args)
    elif kernel.name == "fla_cp_context":  # fla's own CP in place of our exchanges
        o, final_BHKV = _fla_cp_context(kernel, q, k, v, g, beta, group=group, mode=mode,
                                        layout=layout, initial_state=initial_state,
                                        output_final_state=output_final_state,
                                        use_qk_l2norm=use_qk_l2norm, cu_seqlens=cu_seqlens)
    elif mode == "ulysses":
        o, final_BHKV = chunk_gated_delta_rule_ulysses(q, k, v, g, beta, chunk_size=chunk_size,
                                                       kernel=kernel, cu_seqlens=cu_seqlens,
                                                       **args)
    else:
        o, final_BHKV = chunk_gated_delta_rule_kernel_cp(kernel, q, k, v, g, beta, mode=mode,
                                                         cu_seqlens=cu_seqlens, **args)
    return o.to(q.dtype), final_BHKV


def _fla_cp_context(kernel, q, k, v, g, beta, *, group, mode, layout, initial_state,
                    output_final_state, use_qk_l2norm, cu_seqlens):
    """gdn_kernels.FlaCPContextKernel's all_gather on this rank's shard, or KernelUnavailable
    (on every rank alike, before any exchange) where fla's cp_context cannot serve the call."""
    if mode != "all_gather":
        raise KernelUnavailable(f"fla's cp_context serves the all_gather mode only (it "
                                f"all-gathers each rank's affine chain), got mode={mode!r}")
    if initial_state is not None or output_final_state:
        raise KernelUnavailable("fla's cp_context takes no initial_state and returns no final "
                                "state; use gdn_kernel='fla' (this package's CP with fla)")
    o = kernel.all_gather(q, k, v, g, beta, group=group, layout=layout, cu_seqlens=cu_seqlens,
                          use_qk_l2norm_in_kernel=use_qk_l2norm)
    return o, None
