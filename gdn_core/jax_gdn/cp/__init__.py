"""Context parallelism for the JAX gated delta rule: the sequence split over a mesh axis.

Main entry point: `chunk_gated_delta_rule_cp` (global arrays, wraps a shard_map). Inside a
model-wide shard_map use `chunk_gated_delta_rule_cp_shard` (this chip's shard, the axis bound by
the caller) and `conv_halo` for the causal conv. One module per mode — ulysses, p2p,
all_gather, log_scan — and `CP_RULES` maps each mode name to its per-shard rule. Every entry
point takes `layout` (gdn_core.cp_layout: contiguous, or zigzag — two segments per chip, the
global arrays in shard order).
The layer and training step: `cp_gdn_layer` (this chip's shard, inside a shard_map) and
`gdn_layer_cp` (global arrays); `make_cp_train_step` (step.py) runs the whole model in one
shard_map over the sequence axis (with `batch_axis`, a second mesh axis of data-parallel
replicas: a dp × CP mesh), `run_cp_training` (train.py) one trial of it, checked against one
chip by verify.py. A hybrid model's attention layers run `attention_cp`
(attention.py: all_gather_kv, ring, ulysses) beside the GDN layers' mode.
"""

from .attention import attention_cp
from .halo import conv_halo
from .layer import cp_gdn_layer, cp_layer_fn, gdn_layer_cp
from .rule import CP_RULES, chunk_gated_delta_rule_cp, chunk_gated_delta_rule_cp_shard
from .step import make_cp_train_step
from .train import run_cp_training

__all__ = ["CP_RULES", "attention_cp", "chunk_gated_delta_rule_cp",
           "chunk_gated_delta_rule_cp_shard", "conv_halo", "cp_gdn_layer", "cp_layer_fn",
           "gdn_layer_cp", "make_cp_train_step", "run_cp_training"]
