"""Which global tokens each chip holds under context parallelism: the sequence `layout`.

    contiguous: chip r holds tokens r·t … (r+1)·t − 1 (t = T/D).
    zigzag:     the sequence is cut into 2D segments of s = T/(2D) tokens; chip r holds
                segment r then segment 2D−1−r, in that order, as one local shard of t = 2s
                tokens. Causal attention then costs every chip the same (the early segment of
                one chip pairs with the late segment of another), which is why hybrids ask
                for it; every GDN mode serves it too (two segments per chip, folded,
                exchanged and replayed in sequence order).

One definition for both frameworks, the data sharding of a step and the tests (plain numpy
indices: gather with them in torch, jax or numpy).
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def check_layout(layout: str, *, chips: int | None = None, seq_len: int | None = None) -> None:
    """Raise ValueError naming the value when `layout` is unknown or cannot split seq_len."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of: {', '.join(LAYOUTS)}")
    if chips is not None and seq_len is not None:
        parts = chips * (2 if layout == "zigzag" else 1)
        if seq_len % parts:
            raise ValueError(f"seq_len={seq_len} is not divisible by {parts} "
                             f"({'2 × ' if layout == 'zigzag' else ''}chips={chips}), as "
                             f"layout={layout!r} needs")


def segments(*, chip: int, chips: int, layout: Layout) -> tuple[int, ...]:
    """The indices of the segments chip `chip` holds, in local order. Contiguous: segment
    `chip` of D; zigzag: segments `chip` and 2D−1−`chip` of 2D."""
    check_layout(layout)
    if not 0 <= chip < chips:
        raise ValueError(f"chip={chip} is not in 0 … {chips - 1}")
    return (chip,) if layout == "contiguous" else (chip, 2 * chips - 1 - chip)


def local_positions(*, chip: int, chips: int, seq_len: int, layout: Layout) -> np.ndarray:
    """Global token positions of chip `chip`'s local shard, in local order: int64 [T/D]."""
    check_layout(layout, chips=chips, seq_len=seq_len)
    parts = segments(chip=chip, chips=chips, layout=layout)
    size = seq_len // (chips * len(parts))
    return np.concatenate([np.arange(p * size, (p + 1) * size) for p in parts])


def shard_order(*, chips: int, seq_len: int, layout: Layout) -> np.ndarray:
    """Positions of every chip's shard, chip 0's first: int64 [T]. `x[:, order]` lays a global
    sequence out as the chips hold it (chip r's shard is the r-th block of T/D);
    `np.argsort(order)` undoes it."""
    return np.concatenate([local_positions(chip=r, chips=chips, seq_len=seq_len, layout=layout)
                           for r in range(chips)])
