"""JAX's persistent compilation cache for trial processes: a nightly sweep recompiles nothing
it compiled the night before, and trials of one sweep that share a program compile it once.

The cache is a directory per host (or a shared path every host can write, e.g. a GCS bucket
`gs://…` that JAX supports); entries are keyed by the program, the compile options and the
backend, so a cache is never reused across a JAX/XLA upgrade or another chip. The settings
reach the actor as environment variables (read when JAX's config loads in that process).
"""

from __future__ import annotations

import os
from pathlib import Path

JAX_CACHE_DIR_ENV = "GDN_SWEEP_JAX_CACHE_DIR"
"""Overrides the default cache directory; an empty value turns the cache off."""


def default_jax_cache_dir() -> str:
    """$GDN_SWEEP_JAX_CACHE_DIR, else ~/.cache/gdn-sweep/jax-compile ("" = no cache)."""
    if JAX_CACHE_DIR_ENV in os.environ:
        return os.environ[JAX_CACHE_DIR_ENV]
    return str(Path.home() / ".cache" / "gdn-sweep" / "jax-compile")


def jax_cache_env(cache_dir: str | None) -> dict[str, str]:
    """Environment variables that turn JAX's persistent cache on at `cache_dir` (none if empty).

    The thresholds are lowered to zero because XLA:CPU programs of small presets compile in
    seconds and are small: JAX's defaults (1 s, any size) would skip some of them. The key
    includes the programs' metadata: a step's bytes are told apart by the named scopes of its
    collectives (gdn_core.jax_gdn.cp.train.comm_bytes_per_chip), which an entry compiled from
    other source would carry stale.
    """
    if not cache_dir:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": cache_dir,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
            "JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY": "true"}


__all__ = ["JAX_CACHE_DIR_ENV", "default_jax_cache_dir", "jax_cache_env"]
