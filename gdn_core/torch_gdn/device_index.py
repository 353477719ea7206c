"""Index tensors a training step gathers with, built once per device.

A step that built its indices with torch.tensor(list, device=…) or torch.from_numpy(…).to(…)
would copy them from the host on every step (on a GPU, a synchronising host→device copy in the
timed region). device_index builds each index once per (builder, arguments, device) and then
serves the cached tensor: read-only, never written to.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable

import numpy as np
import torch


def device_index(build: Callable[..., object], *args: Hashable,
                 device: torch.device | str) -> torch.Tensor:
    """The int64 tensor of build(*args) (an integer array or sequence) on `device`, built and
    copied from the host on first use only; `build` and `args` must be hashable and build must
    return the same values for the same arguments."""
    return _cached(build, args, torch.device(device))


@functools.lru_cache(maxsize=1024)
def _cached(build: Callable[..., object], args: tuple, device: torch.device) -> torch.Tensor:
    values = np.ascontiguousarray(np.asarray(build(*args), dtype=np.int64))
    return torch.from_numpy(values).to(device)


__all__ = ["device_index"]
