"""gdn_core's analytic counts as the planner calls them, memoised: one answer asks the same
count for every param_sharding, dp and attn_cp / layout variant of a point (thousands of
candidates, a few hundred distinct counts), and each count walks the whole model."""

from __future__ import annotations

import functools

from gdn_core.config import ModelConfig
from gdn_core.flops.executed import hardware_flops_per_step
from gdn_core.flops.model import model_flops_per_step
from gdn_core.memory.step import MemoryPrediction, predict_step_memory
from gdn_core.train_config import TrainConfig

CACHE_SIZE = 8192


@functools.lru_cache(maxsize=CACHE_SIZE)
def hardware_flops(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int, seq_len: int,
                   framework: str, remat: str, attn_cp: str, layout: str, kernels: str) -> int:
    """hardware_flops_per_step(...).total."""
    return hardware_flops_per_step(model_cfg, mode=mode, chips=chips, batch=batch,
                                   seq_len=seq_len, framework=framework, remat=remat,
                                   attn_cp=attn_cp, layout=layout, kernels=kernels).total


@functools.lru_cache(maxsize=CACHE_SIZE)
def model_flops(model_cfg: ModelConfig, *, batch: int, seq_len: int) -> int:
    """model_flops_per_step(...).total."""
    return model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len).total


@functools.lru_cache(maxsize=CACHE_SIZE)
def step_memory(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mode: str, chips: int,
                framework: str, dp: int = 1, attn_cp: str = "all_gather_kv",
                layout: str = "contiguous", kernels: str = "reference") -> MemoryPrediction:
    """predict_step_memory(...) (optimizer included)."""
    return predict_step_memory(model_cfg, train_cfg, mode=mode, chips=chips, framework=framework,
                               dp=dp, attn_cp=attn_cp, layout=layout, kernels=kernels)


__all__ = ["hardware_flops", "model_flops", "step_memory"]
