"""The virtual CPU chips a multi-chip JAX benchmark compiles for."""

from __future__ import annotations


def ensure_virtual_chips(count: int, *, benchmark: str) -> None:
    """Give JAX at least `count` CPU chips; must run before JAX initialises its backends.

    Never lowers a count the process already asked for (a test session's 8 chips must survive
    a benchmark run in-process that needs 2)."""
    import jax

    try:
        if jax.config.jax_num_cpu_devices < count:
            jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # already initialised (e.g. imported by a caller): check it suffices
        pass
    if len(jax.devices()) < count:
        raise SystemExit(f"need {count} JAX devices, have {len(jax.devices())}: run the "
                         f"benchmark in a fresh process (python -m gdn_core.bench {benchmark})")
