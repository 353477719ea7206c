"""Block shapes of the Pallas chunk rule per platform, and TPU's tiling rule checked up front.

One kernel source (chunk_kernels.py), two parameterisations:
    tpu  Mosaic: grid (B, Hv, N chunks), the chunk axis sequential ("arbitrary") carrying the
         state [K, V] float32 in VMEM scratch; each grid step sees one chunk's blocks.
    gpu  Triton (gpu_kernels.py): chunk-parallel calls, grid (B, Hv, N), around sequential
         state passes, grid (B, Hv, Dv / state_block_v), each looping over the chunks (Triton
         runs grid points at once, so a state cannot ride a grid axis); num_warps below.
Chunk 64 on both (fla's and MaxText's; Dk = Dv = 128 at every published Qwen3.5 size).

TPU's rule (Mosaic): in every block the last dim is a multiple of 128 or the array's whole
dim, and the one before it a multiple of 8 or the whole dim. The kernel's blocks are
[C, Dk], [C, Dv], [Dk, Dv] and the per-token rows [1, C] of a [..., N, 1, C] array (1 is the
whole dim), so they obey it at C = 64 for any head dims; `check_tpu_tiling` names any block
that does not, before Mosaic would fail with a less direct message.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Platform = Literal["tpu", "gpu"]
PLATFORMS: tuple[str, ...] = ("tpu", "gpu")
TPU_TILE = (8, 128)
"""(second-to-last, last) block dims must be multiples of these, or the array's whole dims."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BlockPlan:
    """How one platform runs the kernel."""

    platform: str
    """'tpu' (Mosaic) or 'gpu' (Triton)."""
    chunk: int = 64
    """Tokens per chunk (C): the rows of every per-chunk block."""
    num_warps: int | None = None
    """Triton only: warps per program of the chunk-parallel calls (each holds a [K, V] state
    and [C, C] / [C, K] float32 tiles: 8 warps halve the registers each thread needs)."""
    pass_num_warps: int | None = None
    """Triton only: warps per program of the sequential passes ([K, state_block_v] state)."""
    num_stages: int | None = None
    """Triton only: software-pipelining stages of the chunk-parallel calls."""
    state_block_v: int | None = None
    """Triton only: state columns per program of the sequential passes (None: all)."""

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise ValueError(f"platform={self.platform!r} is not one of: {', '.join(PLATFORMS)}")
        if self.chunk < 1 or self.chunk & (self.chunk - 1):
            raise ValueError(f"chunk={self.chunk} must be a power of two (the inverse's merges)")


def block_plan(platform: str, chunk: int = 64) -> BlockPlan:
    """The parameterisation of `platform` at `chunk` tokens per chunk."""
    if platform == "gpu":
        return BlockPlan(platform="gpu", chunk=chunk, num_warps=8, num_stages=1,
                         pass_num_warps=4, state_block_v=32)
    return BlockPlan(platform=platform, chunk=chunk)


def tpu_tiling_violation(block_shape, array_shape) -> str | None:
    """Why `block_shape` (None = squeezed dim) over `array_shape` breaks TPU's (8, 128) rule,
    or None when it obeys it."""
    if len(block_shape) != len(array_shape):
        return f"block {tuple(block_shape)} and array {tuple(array_shape)} differ in rank"
    for position, tile in zip((-2, -1), TPU_TILE):
        if len(block_shape) < -position:
            continue
        size, whole = block_shape[position], array_shape[position]
        size = 1 if size is None else size
        if size % tile and size != whole:
            return (f"block dim {position} is {size}: neither a multiple of {tile} nor the "
                    f"array's whole dim {whole} (block {tuple(block_shape)}, array "
                    f"{tuple(array_shape)})")
    return None


def check_tpu_tiling(blocks: dict[str, tuple[tuple, tuple]]) -> None:
    """Raise ValueError naming every block {name: (block_shape, array_shape)} that breaks TPU's
    tiling rule."""
    problems = [f"{name}: {why}" for name, (block, array) in blocks.items()
                if (why := tpu_tiling_violation(block, array)) is not None]
    if problems:
        raise ValueError("block shapes break TPU's (8, 128) tiling rule: " + "; ".join(problems))
