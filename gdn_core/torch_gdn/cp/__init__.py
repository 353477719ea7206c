"""Context parallelism for the PyTorch gated delta rule.

Entry point: `chunk_gated_delta_rule_cp(q, k, v, g, beta, *, group, mode, ...)` on this rank's
sequence shard. `CP_RULES` maps each mode of `gdn_core.cp_modes.CP_MODES` to its implementation,
one module per mode: `ulysses`, `p2p`, `all_gather`, `log_scan` (the last three share `common`).
`comm.count_comm()` counts the bytes each rank receives; `halo.exchange_conv_halo` brings in the
previous rank's last K−1 tokens for the causal conv. `context_parallel` makes a GatedDeltaNet
(or every one inside a model) run on sequence shards; `run_cp_training` is the per-rank runner
of a CP training step (gradients summed over the group by `grad_sync`: `sum_gradients` after
backward, `OverlappedGradientSum` while backward runs); `mesh.dp_cp_mesh` lays data-parallel
replicas beside the CP groups (CPSettings.dp).
"""

from .comm import CommCounter, count_comm
from .grad_sync import OverlappedGradientSum, sum_gradients
from .halo import exchange_conv_halo
from .layer import ContextParallelGatedDeltaNet, context_parallel
from .rule import CP_RULES, chunk_gated_delta_rule_cp
from .train import run_cp_training

__all__ = ["CP_RULES", "CommCounter", "ContextParallelGatedDeltaNet", "OverlappedGradientSum",
           "chunk_gated_delta_rule_cp", "context_parallel", "count_comm", "exchange_conv_halo",
           "run_cp_training", "sum_gradients"]
