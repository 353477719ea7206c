"""Analytical FLOP counts of a training step, by job:

    model.py        model_flops_per_step: the model's cost (GDN rule, layers, MLP, LM head),
                    MFU's numerator: independent of the kernel, the framework and CP
    maxtext.py      the same step as MaxText counts it, stored beside ours for comparison
    attention.py    the hybrid decoder's full-attention layers, and the pairs attention CP runs
    rule.py         the GDN rule as each kernel runs it (reference: ours; fused: fla's)
    executed.py     hardware_flops_per_step: what a step executes (the rule as its kernel runs it,
                    CP work, recompute, the solve): HFU's numerator
    utilisation.py  mfu and tokens_per_s_per_chip
    conventions.py  the constants and argument checks they share

Conventions (one definition for code, database and dashboard; see docs/architecture.md, Metrics):
- 2 FLOPs per multiply-accumulate (MAC). Only matmul-shaped work is counted. Elementwise work is
  neglected: decays and masks, exp, the q/k L2 norm, SiLU, the gated RMSNorm on the rule's
  output, the other RMSNorms, residual adds and the loss. It is O(tokens × channels), next to
  O(tokens × channels × width) for the matmuls.
- The embedding is a row lookup: 0 matmul FLOPs. The LM head is a matmul and is counted.
- forward + backward = 3 × forward: the backward of a matmul is two matmuls of the same size.
- Counts cover the whole global batch of one step (`batch` sequences of `seq_len` tokens).
  For a per-chip figure the caller divides by the chip count: every chip of a CP group does
  1/chips of the sequence.
- Model FLOPs count the GDN rule in the standard chunked WY form (the form fla's
  chunk_gated_delta_rule computes: C²·(3·Dk + 2·Dv) + 3·C·Dk·Dv MACs per chunk and value
  head), per token, once: no kernel, CP mode or chip count changes it, so MFU moves only with
  the step time. What an implementation runs beyond it is hardware FLOPs: the reference
  rule's per-chunk Dk×Dk transition and state scan and its chunk padding, fla's inverse and
  backward recomputation (rule.py), CP work (executed.cp_overhead_flops), recomputation and
  each framework's solve. MaxText's convention (maxtext.py: the rule in its recurrent view,
  8·Hv·Dk·Dv per token) is stored beside the model count for comparison.
- The hybrid decoder (ModelConfig.layers "hybrid") counts its gated full-attention layers
  with attention.py: projections, and QKᵀ and AV over the causal pairs T·(T + 1)/2
  (MaxText's figure: half the square, T²/2); GDN work only in its GDN layers.

Letters: B batch, T tokens, E hidden size, Hk / Hv key / value heads, Dk / Dv head widths,
C chunk, N = ceil(T / C) chunks, K conv taps, I MLP width, L layers.
"""
