"""fla's rule where it refuses its training backward: the kernel benchmark (kernel.py) then
checks and times fla's forward alone, beside our torch rule's forward, and says that fla's
backward was not run and why.

fla-core 0.6.0 refuses its gated backward on Hopper with 3.4.0 <= Triton < 3.7.1 and no
tilelang (wrong gradients, fla #640): gdn_core.kernels.fla_gated_backward_problem says so up
front, the rule the fused training step resolves by; fla's own RuntimeError is the same refusal
seen late (is_fla_backward_refusal).
"""

from __future__ import annotations

import statistics

import torch

from ..testing import rel_err
from .alternating import time_alternating
from .kernel_runners import FLA_OUTPUT_TOLERANCE, TORCH_DTYPES, torch_rule_runner


def fla_backward_refusal() -> str | None:
    """Why fla refuses its training backward on this GPU (the rule the fused step resolves by,
    gdn_core.kernels.fla_gated_backward_problem), or None."""
    from ..kernels import _cuda_device_facts, fla_gated_backward_problem

    return fla_gated_backward_problem(**_cuda_device_facts())


def is_fla_backward_refusal(err: BaseException) -> bool:
    """Whether `err` is fla's own refusal of its gated backward (chunk_bwd_dqkwg, fla #640):
    the rule the training step skips by (torch_gdn.gdn_kernels.kernel_refusal)."""
    from ..torch_gdn.gdn_kernels import kernel_refusal

    return kernel_refusal(err) is not None


def time_fla_forward_only(fla_rule, args, arrays, flops_fwd: float, *, reason: str) -> bool:
    """fla's forward checked against our float32 torch forward, then timed beside our torch
    rule's forward in the timed dtype (fla's backward may not run here: `reason`). False when
    fla's output disagrees beyond FLA_OUTPUT_TOLERANCE."""
    from ..torch_gdn.chunk import chunk_gated_delta_rule

    print(f"fla: its training backward was NOT run: {reason}. Timing fla's forward alone, "
          "beside our torch rule's forward")
    common = dict(device=args.device, chunk_size=args.chunk_size, backward=False)
    fla_fwd = torch_rule_runner(fla_rule, arrays, dtype=TORCH_DTYPES[args.dtype],
                                transformers_api=True, **common)
    ours_fwd = torch_rule_runner(chunk_gated_delta_rule, arrays, dtype=TORCH_DTYPES[args.dtype],
                                 transformers_api=False, **common)
    reference, _ = torch_rule_runner(chunk_gated_delta_rule, arrays, dtype=torch.float32,
                                     transformers_api=False, **common)()
    try:
        o_err = rel_err(reference, fla_fwd()[0])  # untimed: Triton's autotune runs here
    except Exception as err:  # noqa: BLE001 - any failure inside fla/Triton
        print(f"fla: its forward failed too ({type(err).__name__}: {err}); no fla figures")
        return True
    tolerance = FLA_OUTPUT_TOLERANCE[args.dtype]
    print(f"check fla forward ({args.dtype}) vs ours_torch (float32): output rel err "
          f"{o_err:.2e} (tolerance {tolerance:.0e})")
    if o_err > tolerance:
        print("FAILED: fla's forward and our rule disagree beyond the tolerance; not timing")
        return False
    times = time_alternating({"fla_fwd": fla_fwd, "ours_torch_fwd": ours_fwd},
                             warmup=max(1, args.warmup), repeats=args.repeats)
    ours = statistics.median(times["ours_torch_fwd"])
    print(f"forward only ({args.repeats} timed runs each, alternating; gdn_rule_flops, "
          "forward):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<15} median {med:.4f} s, {flops_fwd / med / 1e9:.2f} GFLOP/s, "
              f"{med / ours:.3f} x ours_torch_fwd")
    return True


__all__ = ["fla_backward_refusal", "is_fla_backward_refusal", "time_fla_forward_only"]
