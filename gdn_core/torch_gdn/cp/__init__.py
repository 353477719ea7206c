"""Context parallelism for the PyTorch gated delta rule.

Entry point: `chunk_gated_delta_rule_cp(q, k, v, g, beta, *, group, mode, ...)` on this rank's
sequence shard. `CP_RULES` maps each mode of `gdn_core.cp_modes.CP_MODES` to its implementation,
one module per mode: `ulysses`, `p2p`, `all_gather`, `log_scan` (the last three share `common`).
`comm.count_comm()` counts the bytes each rank receives; `halo.exchange_conv_halo` brings in the
previous rank's last K−1 tokens for the causal conv.
"""

from .comm import CommCounter, count_comm
from .halo import exchange_conv_halo
from .rule import CP_RULES, chunk_gated_delta_rule_cp

__all__ = ["CP_RULES", "CommCounter", "chunk_gated_delta_rule_cp", "count_comm",
           "exchange_conv_halo"]
