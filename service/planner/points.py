"""The capacity planner's candidate points, and which trials are evidence for one.

A point is a framework, a mesh (dp replicas × a CP group of chips / dp chips), the GDN layers'
CP mode and, for the hybrid decoder, the attention layers' CP mode (attn_cp) and the sequence
layout, with the step settings (param_sharding, remat). A trial is evidence for a point only
where it ran the same decoder (layers), and — for its mode-specific figures — the same attn_cp
and layout (a one-chip trial, which splits nothing, serves every one).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

from gdn_core.config import FULL_ATTENTION, ModelConfig
from gdn_core.cp_layout import LAYOUTS, check_layout
from gdn_core.cp_modes import (ATTN_CP_MODES, ONE_CHIP_CP_MODE, check_attention_cp_shape,
                               check_cp_shape)
from service.planner.evidence import Observation
from service.planner.meshes import mesh_dps
from service.schemas.planner import CapacityRequest



@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    framework: str
    mode: str
    chips: int
    """All chips of the mesh: dp × cp_chips."""
    param_sharding: str
    remat: str
    dp: int = 1
    layers: str = "gdn_only"
    attn_cp: str | None = None
    """The attention layers' CP mode; None without attention layers or without CP."""
    layout: str = "contiguous"

    @property
    def cp_chips(self) -> int:
        return self.chips // self.dp

    def replica(self) -> Point:
        """One replica of the mesh: the dp = 1 point on its CP chips."""
        return dataclasses.replace(self, chips=self.cp_chips, dp=1)


def model_for(model_cfg: ModelConfig, layers: str) -> ModelConfig:
    """The request's model as the decoder `layers` (gdn_only, or the hybrid), its hybrid
    pattern spelled out (layer_types: the same pattern, read without being rebuilt on every
    count)."""
    if model_cfg.layers == layers:
        return model_cfg
    kinds = (model_cfg.layer_types or model_cfg.attention.layer_types(model_cfg.num_layers)
             if layers == "hybrid" else model_cfg.layer_types)
    return dataclasses.replace(model_cfg, layers=layers, layer_types=kinds)


def has_attention(model_cfg: ModelConfig) -> bool:
    """Whether the decoder has a full-attention layer (a hybrid of depth ≥ its interval)."""
    return FULL_ATTENTION in model_cfg.layer_pattern


def chip_counts(max_chips: int, observations: Sequence[Observation]) -> list[int]:
    powers = {2 ** i for i in range(int(math.log2(max_chips)) + 1)}
    return sorted(powers | {o.chips for o in observations if o.chips <= max_chips})


def matches(o: Observation, request: CapacityRequest, point: Point, num_layers: int, *,
            any_dp: bool = False) -> bool:
    """A trial of the point's step settings and decoder (any CP mode)."""
    return (o.framework == point.framework and o.kernels == request.kernels
            and (any_dp or o.dp == point.dp) and o.dtype == request.dtype
            and o.batch_size == request.batch_size and o.num_layers == num_layers
            and o.param_sharding == point.param_sharding and o.remat == point.remat
            and o.layers == point.layers)


def same_split(o: Observation, point: Point) -> bool:
    """Whether o split its attention and sequence as the point does: the same attn_cp and
    layout, or no split at all (one chip per replica: evidence for every variant)."""
    return o.cp_chips == 1 or (o.attn_cp == point.attn_cp and o.layout == point.layout)


UNDOMINATED_SPLITS = (("ring", "zigzag"), ("all_gather_kv", "contiguous"),
                      ("ulysses", "contiguous"))
"""The hybrid's (attn_cp, layout) pairs planned when neither is listed. The others are
dominated by gdn_core's own counts, so they are not computed: a ring over contiguous shards
computes more pairs than over zigzag ones (D(D+1)/2 blocks of t² against D(2D+1)/4) and leaves
the last chip the most, in the same memory; all_gather_kv (each chip t queries × T keys) and
ulysses (whole sequence per head shard) do the same work in the same memory under either
layout. Any pair a stored trial ran is planned as well (its evidence may say otherwise)."""


def variants(request: CapacityRequest, layers: str, cp: int, *, seq_len: int,
             evidenced: frozenset = frozenset()) -> list[tuple[str | None, str]]:
    """(attn_cp, layout) pairs a point of `layers` on a cp-chip replica is planned for: none
    without CP; a gdn_only decoder has no attention (and the same work under either layout:
    contiguous unless layouts are asked for); a hybrid the listed ones, or by default
    UNDOMINATED_SPLITS (a ring over contiguous shards where zigzag cannot split seq_len) and
    the `evidenced` pairs."""
    if cp == 1:
        return [(None, "contiguous")]
    if layers != "hybrid":
        return [(None, layout) for layout in request.layouts or ["contiguous"]]
    if request.attn_cps or request.layouts:
        return list(itertools.product(request.attn_cps or list(ATTN_CP_MODES),
                                      request.layouts or list(LAYOUTS)))
    ring = "zigzag" if seq_len % (2 * cp) == 0 else "contiguous"
    pairs = [("ring", ring), *UNDOMINATED_SPLITS[1:]]
    return pairs + sorted(p for p in evidenced if p not in pairs)


def candidate_points(request: CapacityRequest, observations: Sequence[Observation],
                     model_cfg: ModelConfig) -> Iterator[Point]:
    """Every point of the request a chip count can split (shape checks as the trials' own:
    a mode, attn_cp or layout that cannot split the shape over a replica's chips is left
    out)."""
    gdn = model_cfg.gdn
    for layers in request.planned_layers():
        attention = has_attention(model_for(model_cfg, layers))
        evidenced = frozenset((o.attn_cp, o.layout) for o in observations
                              if o.layers == layers and o.cp_chips > 1 and o.attn_cp)
        for chips in chip_counts(request.max_chips, observations):
            for dp, framework in itertools.product(mesh_dps(chips, request.dp),
                                                   request.frameworks):
                cp = chips // dp
                for mode in ([ONE_CHIP_CP_MODE] if cp == 1 else request.modes):
                    try:
                        check_cp_shape(mode=mode, chips=cp, seq_len=request.seq_len,
                                       num_k_heads=gdn.num_k_heads,
                                       num_v_heads=gdn.num_v_heads,
                                       conv_kernel_size=gdn.conv_kernel_size)
                    except ValueError:
                        continue
                    for attn_cp, layout in variants(request, layers, cp,
                                                    seq_len=request.seq_len,
                                                    evidenced=evidenced):
                        if not _splits(attn_cp, layout, cp=cp, seq_len=request.seq_len,
                                       model_cfg=model_cfg, attention=attention):
                            continue
                        for param_sharding in (["replicated"] if chips == 1
                                               else request.param_shardings):
                            for remat in request.remats:
                                yield Point(framework, mode, chips, param_sharding, remat,
                                            dp, layers, attn_cp, layout)


def _splits(attn_cp, layout, *, cp: int, seq_len: int, model_cfg, attention: bool) -> bool:
    try:
        check_layout(layout, chips=cp, seq_len=seq_len)
        if attention and attn_cp is not None:
            check_attention_cp_shape(attn_cp=attn_cp, chips=cp,
                                     num_heads=model_cfg.attention.num_heads)
    except ValueError:
        return False
    return True


__all__ = ["UNDOMINATED_SPLITS", "Point", "candidate_points", "chip_counts",
           "has_attention", "matches", "model_for", "same_split", "variants"]
