"""The memory of one chip, for the dashboard's peak-memory plot line."""

from __future__ import annotations

import os
from functools import lru_cache

from gdn_core import datasheets


@lru_cache
def chip_memory(kind: str, accelerator_type: str) -> tuple[int | None, str | None]:
    """(bytes, label): datasheet HBM per chip, or this host's RAM for CPU virtual chips."""
    if kind == "cpu":
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None, None
        return total, "host RAM of the service host (CPU chips share it)"
    try:
        total = datasheets.hbm_bytes_per_chip(accelerator_type)
    except ValueError:
        return None, None
    return total, f"{accelerator_type} HBM per chip ({total / datasheets.GIB:.0f} GiB)"
