"""What the kernel benchmark (kernel.py) and its fla forward-only path (kernel_fla.py) share:
the timed dtypes, fla's output tolerance, a torch rule's runner and the alternating timer."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FLA_OUTPUT_TOLERANCE = {"float32": 5e-3, "bfloat16": 2e-2, "float16": 1e-2}
"""Largest relative error of fla's output vs our float32 torch rule, by timed dtype: fla's
float32 kernels use TF32 dots (10-bit mantissa), its bf16 ones bf16 operands (8-bit). Chosen
from those mantissas, not yet measured on a GPU: tighten after the first device run."""


def torch_rule_runner(rule: Callable, arrays, *, device, dtype, chunk_size, transformers_api,
                      backward: bool = True):
    """A callable running fwd + bwd once (device synchronised); returns (o, grads).

    transformers_api: `rule` takes transformers' (and fla's) keywords, chunk_size and
    use_qk_l2norm_in_kernel, rather than ours (use_qk_l2norm). backward=False: the forward
    alone, without autograd (grads []).
    """
    inputs = [torch.from_numpy(arrays[n]).to(device=device, dtype=dtype)
              for n in ("q", "k", "v", "g", "beta")]
    do = torch.from_numpy(arrays["do"]).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run():
        leaves = [x.detach().requires_grad_(backward) for x in inputs]
        with contextlib.nullcontext() if backward else torch.no_grad():
            if transformers_api:
                o, _ = rule(*leaves, chunk_size=chunk_size, use_qk_l2norm_in_kernel=True)
            else:
                o, _ = rule(*leaves, chunk_size=chunk_size, use_qk_l2norm=True)
        if backward:
            (o.float() * do).sum().backward()
        sync()
        return o, [x.grad for x in leaves] if backward else []

    return run


__all__ = ["FLA_OUTPUT_TOLERANCE", "TORCH_DTYPES", "torch_rule_runner"]
