"""fla-core's chunk_gated_delta_rule on a CPU under Triton's interpreter (the switch:
gdn_core.interpreted_kernels), with the shims its kernels need there, written against the
versions in SHIMS_WRITTEN_FOR (tests/gdn_core/test_torch_fused_interpreted.py runs fla with and
without each shim, so a new version that breaks them, or no longer needs one, fails a test):
  1. Triton's autotuner times each config through a GPU driver ("0 active drivers"): every
     config scores the same, so the first is taken (interpreted timings mean nothing anyway).
  2. fla's kernels call `.to(tl.int64)` on a `range` loop index, which the interpreter leaves
     a Python int: inside fla's kernel modules `range` yields ints that have that method.
and for fla's own context parallelism (its cp_context, fla.ops.cp), two more:
  3. fla.ops.cp refuses any device but an NVIDIA GPU (Ampere or newer) before it runs: CPU
     tensors pass (the interpreter computes its tf32x3 dots in float32).
  4. Its all-gather hands torch a stacked [world, …] output, which NCCL takes and gloo does
     not: the same memory goes to torch as [world·n, …] (what both take).
"""

from __future__ import annotations

import builtins
import functools
import os
import sys

from ..interpreted_kernels import INTERPRET_ENV, triton_installed
from ..kernels import FLA_MODULE, KernelUnavailable

SHIMS_WRITTEN_FOR = {"triton": "3.9.0", "fla-core": "0.6.0"}
"""The package versions the two shims were written and checked against."""


class _LoopIndex(int):
    """A loop index fla's kernels can call `.to(dtype)` on, as compiled Triton allows."""

    def to(self, dtype, **_):
        return _modules()["tl"].full((), int(self), dtype)


def _kernel_range(*args):
    return (_LoopIndex(i) for i in builtins.range(*args))


def _equal_timings(self, *args, config=None, **kwargs):
    return [1.0, 1.0, 1.0]


@functools.cache
def _modules() -> dict:
    """Triton's and fla's modules this file touches, imported in interpreter mode (the
    environment is set first; it only takes effect for what is not imported yet). Once per
    process: every loop index of an interpreted kernel asks for `tl` (a failed import is not
    cached)."""
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language as tl
        import fla.ops.cp.chunk_bwd  # noqa: F401 - the cp modules shims 3 and 4 patch
        import fla.ops.cp.chunk_delta_h  # noqa: F401
        import fla.ops.cp.chunk_fwd  # noqa: F401
        import fla.ops.cp.chunk_merge  # noqa: F401
        from fla.ops.common import chunk_delta_h
        from fla.ops.cp import build_cp_context
        from fla.ops.cp.context import _check_cp_device
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from triton.runtime import autotuner
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError as err:
        raise KernelUnavailable(f"fla-core under Triton's interpreter needs triton and fla-core "
                                f"({err}): pip install 'gdn-sweep[kernels]'") from err
    return dict(tl=tl, autotuner=autotuner, interpreted=InterpretedFunction,
                rule=chunk_gated_delta_rule, build_cp_context=build_cp_context,
                check_cp_device=_check_cp_device, state_kernel=(
                    chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64))


def install_shims(*, autotuner: bool = True, loop_index: bool = True) -> None:
    """Patch Triton's autotuner and fla's imported kernel modules (module docstring); the
    keywords exist so a test can leave one out and see that it is still needed."""
    modules = _modules()
    if autotuner:
        modules["autotuner"].Autotuner._bench = _equal_timings
    if loop_index:
        for name, module in list(sys.modules.items()):
            if module is not None and name.startswith("fla.ops") and "naive" not in name:
                module.range = _kernel_range


def _cpu_or_cuda_device(device) -> None:
    """fla.ops.cp's device check with the CPU admitted (shim 3); a GPU is checked as fla does."""
    if device.type != "cpu":
        _modules()["check_cp_device"](device)


def _flat_all_gather(inp, out=None, group=None, async_op=False):
    """fla.ops.cp.comm.all_gather_into_tensor with its output handed to torch flat (shim 4)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group=group)
    if out is None:
        out = torch.empty(world, *inp.shape, device=inp.device, dtype=inp.dtype)
    handle = dist.all_gather_into_tensor(out.view(world * inp.shape[0], *inp.shape[1:]),
                                         inp.contiguous(), group=group, async_op=async_op)
    return out, handle


def install_cp_shims(*, device_check: bool = True, all_gather: bool = True) -> None:
    """Shims 3 and 4 in fla.ops.cp's modules (module docstring)."""
    _modules()  # fla.ops.cp imported in interpreter mode
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("fla.ops.cp."):
            continue
        if device_check and hasattr(module, "_check_cp_device") and name != "fla.ops.cp.context":
            module._check_cp_device = _cpu_or_cuda_device
        if all_gather and hasattr(module, "all_gather_into_tensor") \
                and name != "fla.ops.cp.comm":
            module.all_gather_into_tensor = _flat_all_gather


def _decorated_for_interpreter(kernel, interpreted_type) -> bool:
    """Whether a (possibly autotuned) Triton function was decorated for the interpreter."""
    while not isinstance(kernel, interpreted_type) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return isinstance(kernel, interpreted_type)


@functools.cache
def load_fla_gated_delta_rule():
    """fla-core's chunk_gated_delta_rule, runnable on a CPU under Triton's interpreter; the
    checks and shims run once per process (every kernel call asks).

    Raises KernelUnavailable when triton or fla-core is missing, or either was imported in
    this process before the interpreter was on (their functions are compiled-mode then)."""
    if not triton_installed():
        raise KernelUnavailable("Triton's interpreter needs triton: pip install "
                                "'gdn-sweep[kernels]'")
    modules = _modules()
    if not all(_decorated_for_interpreter(kernel, modules["interpreted"])
               for kernel in (modules["tl"].sum, modules["state_kernel"])):
        raise KernelUnavailable(f"{FLA_MODULE} or triton was imported in this process before "
                                "Triton's interpreter was switched on; start the process with "
                                f"{INTERPRET_ENV}=1 (or TRITON_INTERPRET=1) set")
    install_shims()
    install_cp_shims()
    return modules["rule"]


def load_fla_cp_context_builder():
    """fla.ops.cp.build_cp_context, its CP kernels runnable on a CPU (load first)."""
    load_fla_gated_delta_rule()
    return _modules()["build_cp_context"]


__all__ = ["SHIMS_WRITTEN_FOR", "install_cp_shims", "install_shims",
           "load_fla_cp_context_builder", "load_fla_gated_delta_rule"]
