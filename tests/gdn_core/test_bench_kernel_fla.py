"""The kernel benchmark where fla refuses its training backward (gdn_core/bench/kernel_fla.py):
fla's forward alone is checked and timed, and the output says the backward was not run and
why. fla needs a GPU; on this CPU transformers' rule, which takes fla's keywords, stands in for
it (torch only: no JAX compile)."""

from __future__ import annotations

import pytest
import torch

from gdn_core import kernels
from gdn_core.bench import kernel, kernel_fla
from gdn_core.torch_gdn.chunk import chunk_gated_delta_rule

FLA_REFUSAL = ("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for "
               "gated chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1 or "
               "install tilelang: `pip install tilelang`")
"""fla-core 0.6.0's own message (fla/ops/common/chunk_o.py)."""
SHAPE = dict(batch=1, seq_len=128, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)


def args_and_arrays():
    args = kernel.build_parser().parse_args(
        ["--device", "cpu", "--seq-len", "128", "--num-k-heads", "1", "--num-v-heads", "2",
         "--head-k-dim", "16", "--head-v-dim", "16", "--chunk-size", "64", "--repeats", "2",
         "--warmup", "0", "--threads", "1"])
    return args, kernel.make_inputs(**SHAPE)


class RefusingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o):
        return o.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(FLA_REFUSAL)


def refusing_rule(*inputs, **options):
    """fla as it behaves on Hopper with Triton 3.6: forward fine, backward refused."""
    o, state = kernel._load_transformers_rule()(*inputs, **options)
    return RefusingBackward.apply(o), state


@pytest.mark.timeout(60)
def test_a_refused_backward_times_flas_forward_alone_and_says_why(capsys):
    args, arrays = args_and_arrays()
    assert kernel_fla.time_fla_forward_only(refusing_rule, args, arrays, 1e6,
                                            reason="the stated reason")
    out = capsys.readouterr().out
    assert "its training backward was NOT run: the stated reason" in out
    assert "check fla forward (float32) vs ours_torch (float32): output rel err" in out
    timed = [line.split() for line in out.splitlines()
             if line.strip().startswith(("fla_fwd", "ours_torch_fwd"))]
    assert [t[0] for t in timed] == ["fla_fwd", "ours_torch_fwd"]
    assert all(float(t[2]) > 0 for t in timed)
    assert timed[1][-3:] == ["1.000", "x", "ours_torch_fwd"]  # ours against itself


@pytest.mark.timeout(60)
def test_a_forward_that_disagrees_is_not_timed(capsys):
    args, arrays = args_and_arrays()

    def wrong_rule(*inputs, **options):
        o, state = refusing_rule(*inputs, **options)
        return 2 * o, state
    assert not kernel_fla.time_fla_forward_only(wrong_rule, args, arrays, 1e6, reason="r")
    out = capsys.readouterr().out
    assert "FAILED: fla's forward and our rule disagree" in out and "fla_fwd " not in out


@pytest.mark.timeout(60)
def test_flas_own_refusal_in_the_check_comes_back_as_the_reason():
    args, arrays = args_and_arrays()
    reference = kernel.torch_rule_runner(chunk_gated_delta_rule, arrays, device="cpu",
                                         dtype=torch.float32, chunk_size=64,
                                         transformers_api=False)()
    runners, agrees, refusal = kernel.add_fla_anchor({}, refusing_rule, args, arrays,
                                                     reference=reference)
    assert runners == {} and agrees and "#640" in refusal and refusal.startswith("fla raised")
    assert kernel_fla.is_fla_backward_refusal(RuntimeError(FLA_REFUSAL))
    assert not kernel_fla.is_fla_backward_refusal(RuntimeError("CUDA out of memory"))


def test_the_refusal_is_decided_by_the_rule_the_fused_step_uses(monkeypatch):
    hopper = dict(device_name="NVIDIA H100 80GB HBM3", capability=(9, 0),
                  triton_version="3.6.0", tilelang_installed=False)
    monkeypatch.setattr(kernels, "_cuda_device_facts", lambda: hopper)
    reason = kernel_fla.fla_backward_refusal()
    assert reason is not None and "3.6.0" in reason and "#640" in reason
    monkeypatch.setattr(kernels, "_cuda_device_facts", lambda: {**hopper,
                                                                "triton_version": "3.7.1"})
    assert kernel_fla.fla_backward_refusal() is None
