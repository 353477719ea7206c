"""PyTorch Gated DeltaNet: the chunked rule, its token-by-token reference, layer, model, CP.

Main entry points: `chunk_gated_delta_rule` (one chip) and, for context parallelism,
`chunk_gated_delta_rule_cp` and `context_parallel`; `GatedDeltaNet` (the Qwen3.5 layer),
`GDNLanguageModel` (with `set_remat` and its chunked cross-entropy,
`chunked_cross_entropy_sum`), `HybridLanguageModel` (the published decoder: GDN and gated
full-attention layers, `GatedAttention`), and the training step `train_step` /
`run_training` (under CP: `run_cp_training`, with param_sharding applied by `cp.sharding`).
"""

from .attention import GatedAttention
from .chunk import chunk_gated_delta_rule
from .cp import chunk_gated_delta_rule_cp, context_parallel, run_cp_training
from .hybrid import HybridLanguageModel
from .layer import GatedDeltaNet, causal_conv1d
from .loss import chunked_cross_entropy_sum
from .model import GDNLanguageModel, set_remat
from .naive import recurrent_gated_delta_rule
from .train import build_model, build_optimizer, build_training, run_training, train_step

__all__ = [
    "GDNLanguageModel",
    "GatedAttention",
    "GatedDeltaNet",
    "HybridLanguageModel",
    "build_model",
    "build_optimizer",
    "build_training",
    "causal_conv1d",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_cp",
    "chunked_cross_entropy_sum",
    "context_parallel",
    "recurrent_gated_delta_rule",
    "run_cp_training",
    "run_training",
    "set_remat",
    "train_step",
]
