"""Virtual CPU chips: the JAX devices a multi-chip program compiles for on a CPU host.

Used by the compile-only planner (plan.py) and the multi-chip benchmarks (gdn_core.bench), each
in a fresh process that asks for as many chips as its largest mesh.
"""

from __future__ import annotations


def ensure_virtual_chips(count: int, *, fresh_process: str) -> None:
    """Give JAX at least `count` CPU chips; must run before JAX initialises its backends.

    Never lowers a count the process already asked for (a test session's 8 chips must survive
    a benchmark run in-process that needs 2). fresh_process: the command that runs the caller
    in a fresh process, named in the error when JAX already started with too few chips.
    """
    import jax

    try:
        if jax.config.jax_num_cpu_devices < count:
            jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # already initialised (e.g. imported by a caller): check it suffices
        pass
    if len(jax.devices()) < count:
        raise SystemExit(f"need {count} JAX devices, have {len(jax.devices())}: run it in a "
                         f"fresh process ({fresh_process})")
