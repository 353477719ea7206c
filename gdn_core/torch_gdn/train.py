"""PyTorch training step for the language model (GDN-only, or the hybrid decoder when
ModelConfig.layers is 'hybrid'): AdamW, fp32 master weights, optional bf16.

The loss is written as (sum of this process's token losses) / (global token count), so the
losses of context-parallel ranks, each holding a sequence shard, sum to the global mean; their
gradients sum likewise, which is what the `grad_sync` hook (an all-reduce-sum under CP) does.
A step reads nothing back to the host (no `.item()`, no index built from host data): it returns
its loss as a device tensor, which the runners read after the timed steps.
The loss is the model's chunked cross-entropy (no [tokens, V] float32 logits); TrainConfig.remat
is applied by build_model. dtype 'bfloat16' is torch.autocast to bf16 (CPU and CUDA alike: both
run bf16 matmuls there) over fp32 master weights and fp32 AdamW state; the GDN rule's state chain
stays float32 inside the layer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from torch import nn

from .. import device_memory
from ..config import ModelConfig
from ..data import synthetic_tokens
from ..packing import document_boundaries
from ..train_config import COMPUTE_DTYPES, TrainConfig, TrainReport
from .hybrid import HybridLanguageModel
from .model import GDNLanguageModel, set_remat
from .timed_steps import run_timed_steps

GradSync = Callable[[nn.Module], object]
"""Called after backward, before the optimizer step. One that also has `prepare(model)` (e.g.
cp.grad_sync.OverlappedGradientSum) gets that call before backward, to start its collectives
while backward runs."""


def autocast_context(device_type: str, dtype: str):
    """torch.autocast to bf16 for dtype 'bfloat16'; a no-op for 'float32'."""
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of: {', '.join(COMPUTE_DTYPES)}")
    if dtype == "bfloat16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs_BT: torch.Tensor,
               targets_BT: torch.Tensor, *, global_tokens: int, dtype: str,
               grad_sync: GradSync | None = None, loss_chunk_tokens: int | None = None,
               cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Run forward, backward, grad_sync(model) if given, and one optimizer step.

    Args:
        inputs_BT, targets_BT: this process's integer tokens [B, T] (a sequence shard under CP).
        global_tokens: tokens over all processes; the loss is sum(token losses here) / it.
        dtype: 'float32', or 'bfloat16' for autocast compute over fp32 master weights.
        grad_sync: called after backward, before the update (CP all-reduces gradients there);
            its prepare(model), if it has one, before backward.
        loss_chunk_tokens: tokens per cross-entropy chunk (default: loss.loss_chunk_tokens(V)).
        cu_seqlens: packed documents of every row (GLOBAL boundaries under CP; kept on the
            host, where reading it waits for nothing), or None for one document per row.
    Returns:
        This process's share of the mean loss, a detached float32 scalar tensor on the
        inputs' device (CP ranks' shares sum to the mean): reading it (float(), .item()) waits
        for the device, so read it after the timed steps.
    """
    if global_tokens < targets_BT.numel():
        raise ValueError(f"global_tokens={global_tokens} is fewer than this process's "
                         f"{targets_BT.numel()} target tokens")
    optimizer.zero_grad(set_to_none=True)
    with autocast_context(inputs_BT.device.type, dtype):
        loss_sum = model(inputs_BT, targets_BT, loss_chunk_tokens=loss_chunk_tokens,
                         cu_seqlens=cu_seqlens)
    loss = loss_sum / global_tokens
    prepare = getattr(grad_sync, "prepare", None)
    if prepare is not None:
        prepare(model)
    loss.backward()
    if grad_sync is not None:
        grad_sync(model)
    optimizer.step()
    return loss.detach()


def language_model(model_cfg: ModelConfig, *, seed: int = 0) -> nn.Module:
    """The decoder model_cfg describes: HybridLanguageModel when model_cfg.layers is 'hybrid'
    (GDN and gated full-attention layers), else the GDN-only GDNLanguageModel."""
    if model_cfg.layers == "hybrid":
        return HybridLanguageModel(model_cfg, seed=seed)
    return GDNLanguageModel(model_cfg, seed=seed)


def build_model(model_cfg: ModelConfig, train_cfg: TrainConfig,
                device: str | torch.device = "cpu") -> nn.Module:
    """Return the model (language_model): fp32 weights seeded by train_cfg.seed, on `device`,
    train_cfg.remat set."""
    model = language_model(model_cfg, seed=train_cfg.seed).to(device)
    return set_remat(model, train_cfg.remat)


def build_optimizer(params, train_cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over `params` with train_cfg's learning rate and weight decay."""
    return torch.optim.AdamW(params, lr=train_cfg.learning_rate,
                             weight_decay=train_cfg.weight_decay)


def build_training(model_cfg: ModelConfig, train_cfg: TrainConfig,
                   device: str | torch.device = "cpu"):
    """Return (model, AdamW optimizer) for one chip (build_model, build_optimizer).

    On one chip every param_sharding is the replicated layout, so it is not read here
    (cp.sharding applies it over a CP group).
    """
    model = build_model(model_cfg, train_cfg, device)
    return model, build_optimizer(model.parameters(), train_cfg)


def packed_boundaries(train_cfg: TrainConfig) -> torch.Tensor | None:
    """cu_seqlens of train_cfg.documents (packing.document_boundaries) as a CPU int32 tensor,
    None for 'single'. It stays on the host: the layers read its values there. A verify's
    prefix (seq_len cut short) gets the sequence's first documents, the last one cut."""
    cu = document_boundaries(train_cfg.documents, seq_len=train_cfg.seq_len,
                             seed=train_cfg.seed)
    return None if cu is None else torch.from_numpy(cu)


def run_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, steps: int,
                 warmup_steps: int = 1, device: str | torch.device = "cpu") -> TrainReport:
    """Train on one fixed synthetic batch (packed as train_cfg.documents says): warmup_steps
    untimed steps, then `steps` timed ones.

    Losses cover every step (warm-up included), read back after the last step; step_times_s
    the `steps` timed ones. Peak memory is measured from the start of the run
    (device_memory.torch_peak_memory: CUDA's allocator peak, on CPU the process's RSS
    high-water mark).
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup_steps={warmup_steps} >= 0")
    device = torch.device(device)
    device_memory.torch_reset_peak(device)
    model, optimizer = build_training(model_cfg, train_cfg, device)
    tokens = synthetic_tokens(batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len,
                              vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)
    tokens_BT = torch.from_numpy(tokens).long().to(device)
    inputs_BT, targets_BT = tokens_BT[:, :-1], tokens_BT[:, 1:]
    one_step = functools.partial(train_step, model, optimizer, inputs_BT, targets_BT,
                                 global_tokens=targets_BT.numel(), dtype=train_cfg.dtype,
                                 cu_seqlens=packed_boundaries(train_cfg))
    losses, times, _ = run_timed_steps(one_step, steps=steps, warmup_steps=warmup_steps,
                                       device=device)
    peak_bytes, source = device_memory.torch_peak_memory(device)
    losses = torch.stack(losses).tolist()  # the only read back to the host, after the steps
    return TrainReport(losses=losses, step_times_s=times, peak_memory_bytes=peak_bytes,
                       memory_source=source)
