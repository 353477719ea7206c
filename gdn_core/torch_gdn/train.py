"""PyTorch training step for the GDN language model: AdamW, fp32 master weights, optional bf16.

The loss is written as (sum of this process's token losses) / (global token count), so the
losses of context-parallel ranks, each holding a sequence shard, sum to the global mean; their
gradients sum likewise, which is what the `grad_sync` hook (an all-reduce-sum under CP) does.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..data import synthetic_tokens
from ..train_config import COMPUTE_DTYPES, TrainConfig, TrainReport
from .model import GDNLanguageModel

GradSync = Callable[[nn.Module], None]


def autocast_context(device_type: str, dtype: str):
    """torch.autocast to bf16 for dtype 'bfloat16'; a no-op for 'float32'."""
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of: {', '.join(COMPUTE_DTYPES)}")
    if dtype == "bfloat16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs_BT: torch.Tensor,
               targets_BT: torch.Tensor, *, global_tokens: int, dtype: str,
               grad_sync: GradSync | None = None) -> float:
    """Run forward, backward, grad_sync(model) if given, and one optimizer step.

    Args:
        inputs_BT, targets_BT: this process's integer tokens [B, T] (a sequence shard under CP).
        global_tokens: tokens over all processes; the loss is sum(token losses here) / it.
        dtype: 'float32', or 'bfloat16' for autocast compute over fp32 master weights.
        grad_sync: called after backward, before the update (CP all-reduces gradients there).
    Returns:
        This process's share of the mean loss (a float; CP ranks' shares sum to the mean).
    """
    if global_tokens < targets_BT.numel():
        raise ValueError(f"global_tokens={global_tokens} is fewer than this process's "
                         f"{targets_BT.numel()} target tokens")
    optimizer.zero_grad(set_to_none=True)
    with autocast_context(inputs_BT.device.type, dtype):
        logits_BTV = model(inputs_BT)
    loss_sum = F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten().long(),
                               reduction="sum")
    loss = loss_sum / global_tokens
    loss.backward()
    if grad_sync is not None:
        grad_sync(model)
    optimizer.step()
    return loss.item()


def build_training(model_cfg: ModelConfig, train_cfg: TrainConfig,
                   device: str | torch.device = "cpu"):
    """Return (model, AdamW optimizer): fp32 weights seeded by train_cfg.seed, on `device`."""
    model = GDNLanguageModel(model_cfg, seed=train_cfg.seed).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.learning_rate,
                                  weight_decay=train_cfg.weight_decay)
    return model, optimizer


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Return (peak bytes, source): CUDA max allocated, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux, bytes on macOS.
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_rss"


def run_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, steps: int,
                 warmup_steps: int = 1, device: str | torch.device = "cpu") -> TrainReport:
    """Train on one fixed synthetic batch: warmup_steps untimed steps, then `steps` timed ones.

    Losses cover every step (warm-up included); step_times_s the `steps` timed ones.
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup_steps={warmup_steps} >= 0")
    device = torch.device(device)
    model, optimizer = build_training(model_cfg, train_cfg, device)
    tokens = synthetic_tokens(batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len,
                              vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)
    tokens_BT = torch.from_numpy(tokens).long().to(device)
    inputs_BT, targets_BT = tokens_BT[:, :-1], tokens_BT[:, 1:]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for step in range(warmup_steps + steps):
        _synchronize(device)
        start = time.perf_counter()
        losses.append(train_step(model, optimizer, inputs_BT, targets_BT,
                                 global_tokens=targets_BT.numel(), dtype=train_cfg.dtype))
        _synchronize(device)
        if step >= warmup_steps:
            times.append(time.perf_counter() - start)
    peak_bytes, source = peak_memory(device)
    return TrainReport(losses=losses, step_times_s=times, peak_memory_bytes=peak_bytes,
                       memory_source=source)
