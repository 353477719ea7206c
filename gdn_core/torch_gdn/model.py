"""A GDN-only language model: embedding, N × (GDN block, SwiGLU block), norm, untied LM head.

Parameter names (shared with the JAX twin, do not rename):
    embed_tokens.weight, layers.{i}.gdn_norm.weight, layers.{i}.gdn.<transformers GDN names>,
    layers.{i}.mlp_norm.weight, layers.{i}.mlp.{gate_proj,up_proj,down_proj}.weight,
    norm.weight, lm_head.weight.
Activation recomputation (`set_remat`, TrainConfig.remat) is a setting of each block:
    none — autograd keeps every activation;
    full — the whole block runs under torch.utils.checkpoint: only its input is kept, and
           backward re-runs its forward;
    gdn  — only the GDN core (conv, gates and rule: GatedDeltaNet.core, a context-parallel
           layer's with its exchanges) is recomputed; the projections' outputs are kept.
Recomputation re-runs the whole region (early stop off), so a context-parallel token mixer
re-issues every one of its exchanges in backward, in forward order, on every rank.
Shape legend: B batch, T tokens, D hidden, F MLP width, V vocabulary (logits only).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..train_config import REMATS, Remat
from .layer import GatedDeltaNet, recomputed
from .loss import chunked_cross_entropy_sum

INIT_STD = 0.02


InitStep = tuple[nn.Module, Callable[[torch.Generator], object]]
"""One step of a model's seeded init: (module, draw); draw(generator) sets every parameter of
`module` (its submodules' included), reading them by attribute when it runs. A model's
init_steps, run in order on one generator, are its reset_parameters; torch_gdn.init replays
them one module at a time on host tensors to materialise a meta-device model's shards."""


def run_init_steps(steps: list[InitStep], seed: int) -> None:
    """Run `steps` in order on one CPU generator seeded with `seed` (the draw order fixes the
    weights)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for _, draw in steps:
        draw(generator)


def fill_weight(module: nn.Module, value: float, generator: torch.Generator) -> None:
    del generator  # draws nothing
    module.weight.fill_(value)


def draw_normal_weight(module: nn.Module, generator: torch.Generator) -> None:
    nn.init.normal_(module.weight, 0.0, INIT_STD, generator=generator)


def draw_swiglu(module: "SwiGLU", generator: torch.Generator) -> None:
    for linear in (module.gate_proj, module.up_proj, module.down_proj):
        draw_normal_weight(linear, generator)


class RMSNorm(nn.Module):
    """y = x · rsqrt(mean(x²) + eps) · weight, computed in fp32, returned in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        """Normalise [..., D] over its last dim."""
        x32 = x_BTD.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x_BTD.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)), no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        """Map [B, T, D] to [B, T, D] through width F."""
        return self.down_proj(F.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))


class DecoderBlock(nn.Module):
    """One decoder layer (a token mixer and an MLP): the unit of remat 'full' (set_remat) and
    of FSDP2's sharding (cp.sharding). Subclasses define _residual_pair."""

    remat: Remat = "none"

    def forward(self, x_BTD: torch.Tensor, *args) -> torch.Tensor:
        """Map the residual stream [B, T, D] to [B, T, D] (args: the mixer's extra inputs)."""
        if self.remat == "full":
            return recomputed(self._residual_pair, x_BTD, *args)
        return self._residual_pair(x_BTD, *args)


class GDNBlock(DecoderBlock):
    """Pre-norm residual pair: x + gdn(gdn_norm(x)), then + mlp(mlp_norm(·))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        eps = cfg.gdn.rms_norm_eps
        self.gdn_norm = RMSNorm(cfg.hidden_size, eps)
        self.gdn = GatedDeltaNet(cfg.gdn)
        self.mlp_norm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def _residual_pair(self, x_BTD: torch.Tensor,
                       cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x_BTD = x_BTD + self.gdn(self.gdn_norm(x_BTD), cu_seqlens)
        return x_BTD + self.mlp(self.mlp_norm(x_BTD))


def set_remat(model: nn.Module, remat: Remat) -> nn.Module:
    """Set every DecoderBlock of `model` (GDN-only or hybrid) to recompute `remat` (REMATS) in
    backward; returns model."""
    if remat not in REMATS:
        raise ValueError(f"remat={remat!r} is not one of: {', '.join(REMATS)}")
    for module in model.modules():
        if isinstance(module, DecoderBlock):
            module.remat = remat
        elif isinstance(module, GatedDeltaNet):  # plain or context-parallel
            module.recompute_core = remat == "gdn"
    return model


class GDNLanguageModel(nn.Module):
    """tokens [B, T] → logits [B, T, V] (fp32). Every token-mixing op is a GDN layer.

    A context-parallel wrapper swaps the token mixer of each block, e.g.
    `for block in model.layers: block.gdn = context_parallel(block.gdn, ...)`; everything
    else in the model works per token and runs unchanged on a sequence shard.
    """

    def __init__(self, cfg: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GDNBlock(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.gdn.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.reset_parameters(seed)

    def init_steps(self) -> list[InitStep]:
        """reset_parameters as InitSteps, in draw order: modules in registration order, then
        the embedding and the LM head."""
        steps: list[InitStep] = []
        for module in self.modules():
            if isinstance(module, GatedDeltaNet):
                steps.append((module, functools.partial(module.reset_parameters, std=INIT_STD)))
            elif isinstance(module, RMSNorm):
                steps.append((module, functools.partial(fill_weight, module, 1.0)))
            elif isinstance(module, SwiGLU):
                steps.append((module, functools.partial(draw_swiglu, module)))
        return steps + [(module, functools.partial(draw_normal_weight, module))
                        for module in (self.embed_tokens, self.lm_head)]

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Draw all weights from a generator seeded with `seed` (same seed, same model)."""
        run_init_steps(self.init_steps(), seed)

    def hidden_states(self, tokens_BT: torch.Tensor,
                      cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Return the final normed hidden states [B, T, D] (the LM head's input); cu_seqlens:
        packed documents (documents.py; under CP the GLOBAL boundaries), each mixed alone."""
        x_BTD = self.embed_tokens(tokens_BT.long())
        for block in self.layers:
            x_BTD = block(x_BTD, cu_seqlens)
        return self.norm(x_BTD)

    def forward(self, tokens_BT: torch.Tensor, targets_BT: torch.Tensor | None = None, *,
                loss_chunk_tokens: int | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Return float32 logits [B, T, V] for integer tokens [B, T]; given targets [B, T],
        instead the summed cross-entropy over all B·T tokens (a float32 scalar), computed over
        token chunks without a [B·T, V] logits buffer (loss.chunked_cross_entropy_sum).

        The loss lives in forward so that wrappers that hook forward (FSDP2's gathers of
        lm_head.weight) cover it.
        """
        hidden_BTD = self.hidden_states(tokens_BT, cu_seqlens)
        if targets_BT is None:
            return self.lm_head(hidden_BTD).float()
        return chunked_cross_entropy_sum(hidden_BTD, self.lm_head.weight, targets_BT,
                                         chunk_tokens=loss_chunk_tokens)
