"""Fused kernels on a CPU through their own interpreters: a correctness path, never a speed.

    GDN_SWEEP_INTERPRET_KERNELS=1   kernels="fused" on a CPU runs fla-core's Triton rule under
                                    Triton's interpreter (torch) and splash attention under
                                    Pallas's (JAX, interpret=True); without it such points stay
                                    `skipped` with the reason.

A result that ran an interpreted kernel stores its name with INTERPRETED_SUFFIX, e.g.
"fla-core 0.6.0 chunk_gated_delta_rule (interpreted)"; whatever reads speeds (dashboard,
planner, regressions) leaves such rows out (`is_interpreted`). fla-core under the interpreter,
with its two shims: torch_gdn/fla_interpreter.py; splash: jax_gdn/attention_fused.py.

Triton reads TRITON_INTERPRET when a function is decorated: fla's kernels when fla is imported,
Triton's own library (tl.sum, …) when triton is (torch._dynamo imports it). So with the switch
on, importing this module (gdn_core.kernels imports it) sets TRITON_INTERPRET=1 in the process.
On a GPU the interpreter must not run: the fla kernel refuses CUDA tensors while it is on.
"""

from __future__ import annotations

import os

INTERPRET_ENV = "GDN_SWEEP_INTERPRET_KERNELS"
INTERPRETED_SUFFIX = " (interpreted)"
FLA_DTYPES_INTERPRETED: tuple[str, ...] = ("float32",)
"""What fla's kernels compute in under Triton's interpreter (numpy has no bfloat16)."""


def interpret_kernels_enabled() -> bool:
    """Whether $GDN_SWEEP_INTERPRET_KERNELS asks for interpreted fused kernels on a CPU."""
    return os.environ.get(INTERPRET_ENV, "").strip() == "1"


def triton_interpreter_on() -> bool:
    """Whether this process's Triton decorates kernels for its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "").strip() == "1"


if interpret_kernels_enabled():  # before anything imports triton (see the module docstring)
    os.environ["TRITON_INTERPRET"] = "1"


def interpreted(name: str) -> str:
    """A kernel's stored name, marked as run through its interpreter."""
    return name if name.endswith(INTERPRETED_SUFFIX) else name + INTERPRETED_SUFFIX


def is_interpreted(name: str | None) -> bool:
    """Whether a stored kernel name says it ran interpreted (its speed means nothing)."""
    return bool(name) and name.endswith(INTERPRETED_SUFFIX)


def triton_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


__all__ = ["FLA_DTYPES_INTERPRETED", "INTERPRETED_SUFFIX", "INTERPRET_ENV",
           "interpret_kernels_enabled", "interpreted", "is_interpreted", "triton_installed",
           "triton_interpreter_on"]
