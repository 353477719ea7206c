"""Analytical FLOP counts of a training step, by job:

    model.py        model_flops_per_step: our count of the model (GDN rule, layers, MLP, LM head)
    maxtext.py      the same step as MaxText counts it, stored beside ours for comparison
    attention.py    the hybrid decoder's full-attention layers, and the pairs attention CP runs
    hardware.py     hardware_flops_per_step: what really runs (CP work, recompute, the solve)
    utilisation.py  mfu and tokens_per_s_per_chip
    conventions.py  the constants and argument checks they share

Conventions (one definition for code, database and dashboard; see ARCHITECTURE.md, Metrics):
- 2 FLOPs per multiply-accumulate (MAC). Only matmul-shaped work is counted. Elementwise work is
  neglected: decays and masks, exp, the q/k L2 norm, SiLU, the gated RMSNorm on the rule's
  output, the other RMSNorms, residual adds and the loss. It is O(tokens × channels), next to
  O(tokens × channels × width) for the matmuls.
- The embedding is a row lookup: 0 matmul FLOPs. The LM head is a matmul and is counted.
- forward + backward = 3 × forward: the backward of a matmul is two matmuls of the same size.
- Counts cover the whole global batch of one step (`batch` sequences of `seq_len` tokens).
  For a per-chip figure the caller divides by the chip count: every chip of a CP group does
  1/chips of the sequence.
- The GDN rule is counted as our chunked implementation runs it (gdn_core.torch_gdn.chunk),
  once, with the sequence padded up to a multiple of the chunk as the code pads it. No CP
  overhead is included there; hardware.cp_overhead_flops counts that extra work separately.
- The hybrid decoder (ModelConfig.layers "hybrid") counts its gated full-attention layers
  with attention.py: projections, and QKᵀ and AV over the causal pairs T·(T + 1)/2
  (MaxText's figure: half the square, T²/2); GDN work only in its GDN layers.

Letters: B batch, T tokens, E hidden size, Hk / Hv key / value heads, Dk / Dv head widths,
C chunk, N = ceil(T / C) chunks, K conv taps, I MLP width, L layers.
"""
