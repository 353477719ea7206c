"""torch_gdn.timed_steps: the timed loop both torch runners share (warm-up, timed steps with the
device synchronised, a context around the first timed step, the extra step), and a kernel's own
refusal inside a step leaving it as KernelUnavailable (the trial `skipped` with the reason, not
`failed`: workers.failures.classify)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from gdn_core.kernels import KernelUnavailable
from gdn_core.torch_gdn.timed_steps import one_more_step, run_timed_steps

CPU = torch.device("cpu")
FLA_HOPPER_REFUSAL = (  # fla-core 0.6.0's words (fla/ops/common/chunk_o.py, chunk_bwd_dqkwg)
    "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
    "chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1 or install tilelang: "
    "`pip install tilelang`")


class _RefusingBackward(torch.autograd.Function):
    """Identity forward; a backward that raises as fla's gated backward does on Hopper with
    Triton 3.4–3.7.0 (the kernel's own refusal, met only once the step's backward runs)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(FLA_HOPPER_REFUSAL)


def _training_step(refuse: bool):
    weight = torch.ones(4, requires_grad=True)

    def step() -> torch.Tensor:
        y = _RefusingBackward.apply(weight) if refuse else weight * 2
        loss = y.square().sum()
        loss.backward()
        return loss.detach()

    return step


def test_a_kernel_refusal_inside_the_step_leaves_as_kernel_unavailable():
    with pytest.raises(KernelUnavailable, match=r"chunk_bwd_dqkwg \(see #640\)") as caught:
        run_timed_steps(_training_step(refuse=True), steps=2, warmup_steps=1, device=CPU)
    assert "fla-core refused to run its gated backward" in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError)
    # the extra (profiled) step says the same
    with pytest.raises(KernelUnavailable):
        one_more_step(_training_step(refuse=True), device=CPU)()
    # any other error stays what it was (a `failed` trial)
    def broken():
        raise RuntimeError("shape mismatch in chunk_fwd")
    with pytest.raises(RuntimeError, match="shape mismatch") as other:
        run_timed_steps(broken, steps=1, warmup_steps=0, device=CPU)
    assert not isinstance(other.value, KernelUnavailable)


def test_warmup_timed_steps_and_the_first_timed_context():
    calls, entered = [], []

    @contextlib.contextmanager
    def first():
        entered.append(len(calls))
        yield "measured"

    step = _training_step(refuse=False)
    timed = run_timed_steps(lambda: calls.append(1) or step(), steps=3, warmup_steps=2,
                            device=CPU, before_each=lambda: calls.append(0),
                            measure_first=first)
    assert len(timed.results) == 5 and len(timed.step_times_s) == 3
    assert all(t > 0 for t in timed.step_times_s)
    assert timed.first_timed == "measured" and entered == [2 * 2 + 1]  # the third step's
    assert calls == [0, 1] * 5
    with pytest.raises(ValueError, match="steps=0 must be >= 1"):
        run_timed_steps(step, steps=0, warmup_steps=0, device=CPU)
