"""What every FLOP count shares: FLOPs per MAC, the forward + backward multiplier, and the
argument checks (the counts take explicit integers and reject anything else).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from ..config import SUPPORTED_CHUNK_SIZES

FLOPS_PER_MAC = 2
"""A multiply-accumulate is a multiply and an add."""
FWD_BWD_MULTIPLIER = 3
"""Forward + backward = 3 × forward: a matmul's backward is two matmuls of its size (dX, dW)."""


def check_positive(**values: int) -> None:
    """Raise ValueError naming the first argument that is not a positive integer."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")


def check_positive_number(**values: float) -> None:
    """Raise ValueError naming the first argument that is not a positive finite number."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r} must be a positive finite number")


def check_chunk(chunk_size: int) -> None:
    if chunk_size not in SUPPORTED_CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size!r} is not one of {SUPPORTED_CHUNK_SIZES}")


def sum_fields(obj) -> int:
    """The sum of a FLOP dataclass's fields (its `total`)."""
    return sum(getattr(obj, f.name) for f in dataclasses.fields(obj))


def scaled(obj, factor: int):
    """A FLOP dataclass with every field multiplied by factor."""
    return dataclasses.replace(obj, **{f.name: getattr(obj, f.name) * factor
                                       for f in dataclasses.fields(obj)})


__all__ = ["FLOPS_PER_MAC", "FWD_BWD_MULTIPLIER", "check_chunk", "check_positive",
           "check_positive_number", "scaled", "sum_fields"]
