"""The published Qwen3.5 / Qwen3-Next decoder: GDN layers and gated full-attention layers in
the config's layer pattern (ModelConfig.layer_pattern), one chip.

    tokens ─ embed_tokens
           ─ N × [x + mixer(input_layernorm(x)); x + mlp(post_attention_layernorm(x))]
           ─ norm ─ lm_head → logits
    mixer: GatedDeltaNet (linear_attention layers) or GatedAttention (full_attention layers)

Parameter names are transformers' Qwen3_5ForCausalLM's, so its (text) state_dict loads
strictly: model.embed_tokens.weight, model.layers.{i}.linear_attn.* or .self_attn.*,
model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.input_layernorm.weight,
model.layers.{i}.post_attention_layernorm.weight, model.norm.weight, lm_head.weight. Every norm
but the GDN layer's gated one is zero-centred (weight 0 means scale 1), as transformers'.
A MoE model's MLP is the dense stand-in (ModelConfig.intermediate_size wide, see ModelConfig.moe),
so a MoE checkpoint's expert weights do not load; a dense one's do.
Shape legend: B batch, T tokens, D hidden, V vocabulary, R rotated channels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from .attention import GatedAttention, ZeroCenteredRMSNorm, rotary_cos_sin
from .device_index import device_index
from .layer import GatedDeltaNet
from .loss import chunked_cross_entropy_sum
from .model import (INIT_STD, DecoderBlock, InitStep, SwiGLU, draw_normal_weight, draw_swiglu,
                    fill_weight, run_init_steps)


class HybridDecoderLayer(DecoderBlock):
    """Pre-norm residual pair around one token mixer (GDN or gated attention) and a SwiGLU;
    remat 'full' recomputes the whole layer in backward (set_remat)."""

    def __init__(self, cfg: ModelConfig, kind: str) -> None:
        super().__init__()
        eps = cfg.gdn.rms_norm_eps
        self.kind = kind
        # Registered in transformers' order (mixer, mlp, norms) so the keys come out alike.
        if kind == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(cfg.gdn)
        elif kind == FULL_ATTENTION:
            self.self_attn = GatedAttention(cfg.attention, cfg.hidden_size, eps)
        else:
            raise ValueError(f"layer kind={kind!r} is not {LINEAR_ATTENTION!r} or "
                             f"{FULL_ATTENTION!r}")
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps)

    def _residual_pair(self, x_BTD: torch.Tensor, cos_BTR: torch.Tensor | None,
                       sin_BTR: torch.Tensor | None,
                       cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Map the residual stream [B, T, D] to [B, T, D] (cos/sin: the attention's rotary;
        cu_seqlens: packed documents, each mixed as if alone)."""
        normed_BTD = self.input_layernorm(x_BTD)
        if self.kind == LINEAR_ATTENTION:
            x_BTD = x_BTD + self.linear_attn(normed_BTD, cu_seqlens)
        else:
            x_BTD = x_BTD + self.self_attn(normed_BTD, cos_BTR, sin_BTR, cu_seqlens)
        return x_BTD + self.mlp(self.post_attention_layernorm(x_BTD))


class HybridDecoder(nn.Module):
    """Embedding, the decoder layers and the final norm (transformers' Qwen3_5TextModel)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridDecoderLayer(cfg, kind) for kind in cfg.layer_pattern)
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.gdn.rms_norm_eps)
        self.sequence_positions: Callable[[int], np.ndarray] | None = None
        """t ↦ the global positions of the t tokens a forward holds (a sequence shard's, set
        by context_parallel); None: 0 … t−1."""

    def forward(self, tokens_BT: torch.Tensor, position_ids: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Return the final normed hidden states [B, T, D]; position_ids [B, T] or [T] are the
        tokens' positions in the sequence (default: sequence_positions(T), else 0 … T−1);
        cu_seqlens: the sequence's packed documents (global boundaries, int [N+1], all rows):
        every layer mixes each document as if alone, rotary at the global positions."""
        x_BTD = self.embed_tokens(tokens_BT.long())
        if position_ids is None and self.sequence_positions is not None:
            position_ids = device_index(self.sequence_positions, tokens_BT.shape[1],
                                        device=tokens_BT.device)  # built once per device
        elif position_ids is None:
            position_ids = torch.arange(tokens_BT.shape[1], device=tokens_BT.device)
        cos_BTR = sin_BTR = None
        if FULL_ATTENTION in self.cfg.layer_pattern:
            cos_BTR, sin_BTR = rotary_cos_sin(position_ids, self.cfg.attention)
        for layer in self.layers:
            x_BTD = layer(x_BTD, cos_BTR, sin_BTR, cu_seqlens)
        return self.norm(x_BTD)


class HybridLanguageModel(nn.Module):
    """tokens [B, T] → logits [B, T, V] (fp32): the published hybrid decoder of `cfg`
    (cfg.layer_pattern; a gdn_only config gives every layer a GDN mixer)."""

    def __init__(self, cfg: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = HybridDecoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.reset_parameters(seed)

    def extra_repr(self) -> str:
        kinds = self.cfg.layer_pattern
        text = (f"{self.cfg.name}: {kinds.count(LINEAR_ATTENTION)} GDN + "
                f"{kinds.count(FULL_ATTENTION)} gated-attention layers")
        return f"{text}; {self.cfg.note}" if self.cfg.moe is not None else text

    def init_steps(self) -> list[InitStep]:
        """reset_parameters as InitSteps (model.InitStep), in draw order: modules in
        registration order, then the embedding and (untied) the LM head."""
        steps: list[InitStep] = []
        for module in self.modules():
            if isinstance(module, (GatedDeltaNet, GatedAttention)):
                steps.append((module, functools.partial(module.reset_parameters, std=INIT_STD)))
            elif isinstance(module, ZeroCenteredRMSNorm):
                steps.append((module, functools.partial(fill_weight, module, 0.0)))
            elif isinstance(module, SwiGLU):
                steps.append((module, functools.partial(draw_swiglu, module)))
        heads = [self.model.embed_tokens] + ([] if self.cfg.tie_word_embeddings else
                                             [self.lm_head])
        return steps + [(module, functools.partial(draw_normal_weight, module))
                        for module in heads]

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Draw all weights from a generator seeded with `seed` (same seed, same model):
        linears and embedding N(0, 0.02), zero-centred norms 0, GDN layers as transformers."""
        run_init_steps(self.init_steps(), seed)

    def forward(self, tokens_BT: torch.Tensor, targets_BT: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None,
                loss_chunk_tokens: int | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Return float32 logits [B, T, V] for integer tokens [B, T]; given targets [B, T],
        instead the summed cross-entropy over all B·T tokens (a float32 scalar, computed over
        token chunks as GDNLanguageModel's). cu_seqlens: packed documents (HybridDecoder)."""
        hidden_BTD = self.model(tokens_BT, position_ids, cu_seqlens)
        if targets_BT is None:
            return self.lm_head(hidden_BTD).float()
        return chunked_cross_entropy_sum(hidden_BTD, self.lm_head.weight, targets_BT,
                                         chunk_tokens=loss_chunk_tokens)
