"""How much of the sequence a verify can check on one chip, beside the CP step's own state.

The verify reference is one chip's forward + backward on a prefix of the sequence (replicated
weights, no remat, no optimizer); the chip that runs it also holds the step's weights,
gradients and AdamW state. Both frameworks' CP training (cp/train.py) ask verify_seq_len.
"""

from __future__ import annotations

import dataclasses

from ..config import ModelConfig
from ..cp_modes import check_cp_shape
from ..train_config import TrainConfig
from .step import MemoryPrediction, predict_step_memory


def verify_reference_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, *, seq_len: int,
                            framework: str) -> MemoryPrediction:
    """One chip's forward + backward of the verify reference on the first seq_len tokens:
    replicated weights, no remat, no optimizer (as both frameworks' verify runs it)."""
    reference = dataclasses.replace(train_cfg, seq_len=seq_len, param_sharding="replicated",
                                    remat="none")
    return predict_step_memory(model_cfg.stand_in, reference, mode="p2p", chips=1,
                               framework=framework, optimizer=False)


def verify_seq_len(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mode: str, chips: int,
                   framework: str, budget_bytes: int, attn_cp: str = "all_gather_kv",
                   layout: str = "contiguous", dp: int = 1) -> int | None:
    """The tokens per sequence a verify can compare against one chip within budget_bytes.

    The chip that runs the reference also holds the CP step's weights, gradients and AdamW
    state (resident_state of the step's prediction: laid out over dp replicas × `chips` CP
    chips); the reference must fit beside them. train_cfg's batch is the one the reference
    runs: with dp replicas, the global batch.
    Returns train_cfg.seq_len when the whole sequence fits, else the longest prefix that fits
    and is a valid CP length — a multiple of chips × chunk_size that `mode` can split — or
    None when not even the shortest such prefix fits.
    """
    if not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a non-negative integer")
    # What the run holds: a MoE preset's dense stand-in, not its experts.
    resident = predict_step_memory(model_cfg.stand_in, train_cfg, mode=mode, chips=chips,
                                   framework=framework, attn_cp=attn_cp, layout=layout,
                                   dp=dp).resident_state

    def fits(seq_len: int) -> bool:
        reference = verify_reference_memory(model_cfg, train_cfg, seq_len=seq_len,
                                            framework=framework)
        return resident + reference.total <= budget_bytes

    if fits(train_cfg.seq_len):
        return train_cfg.seq_len
    step = chips * model_cfg.gdn.chunk_size
    gdn = model_cfg.gdn
    valid = []
    for k in range(1, (train_cfg.seq_len - 1) // step + 1):
        try:
            check_cp_shape(mode=mode, chips=chips, seq_len=k * step, num_k_heads=gdn.num_k_heads,
                           num_v_heads=gdn.num_v_heads, conv_kernel_size=gdn.conv_kernel_size,
                           layout=layout)
        except ValueError:
            continue
        valid.append(k * step)
    # Memory grows with the prefix: binary search for the longest one that fits.
    low, high = 0, len(valid)
    while low < high:
        mid = (low + high) // 2
        if fits(valid[mid]):
            low = mid + 1
        else:
            high = mid
    return valid[low - 1] if low else None


__all__ = ["verify_reference_memory", "verify_seq_len"]
