"""A timed torch training step reads nothing back to the host and copies nothing from it:
no `.item()` / `float(tensor)` (aten._local_scalar_dense), no tensor built from host data
(torch.tensor / as_tensor / from_numpy: aten.lift_fresh) and no copy of the host's int32
cu_seqlens (aten._to_copy of an int32 tensor: on a GPU, a host→device copy per layer) issued
by gdn_core, on one chip and under CP (ulysses on zigzag shards, the hybrid decoder, packed
documents, the gradient all-reduce overlapped with backward). Counted with a
TorchDispatchMode, no patching; an op torch itself issues (e.g. AdamW reading its CPU step
counter) is torch's, not ours."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gdn_core
from gdn_core.cp_modes import CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.presets import get_preset
from gdn_core.torch_gdn.cp.train import build_cp_training, gradient_sync, shard_batch
from gdn_core.torch_gdn.train import build_training, packed_boundaries, train_step
from gdn_core.train_config import TrainConfig

from .torch_dist import run_in_process_group

HOST_OPS = {"aten._local_scalar_dense.default": "read to the host",
            "aten.lift_fresh.default": "tensor from host data"}
GDN_CORE = Path(gdn_core.__file__).parent
TORCH = Path(torch.__file__).parent
PLUMBING = {str(TORCH / name) for name in (
    "utils/_python_dispatch.py", "_ops.py", "overrides.py", "_tensor.py", "_compile.py",
    "_dynamo/eval_frame.py")}
"""Frames between the code that asked for an op and this mode's __torch_dispatch__ (the
dispatch wrappers, and Tensor's Python methods: an f-string of a tensor is its caller's
read)."""


class HostSyncs(TorchDispatchMode):
    """Every HOST_OPS op, with the innermost Python frame that issued it (not PLUMBING): one in
    torch (an optimizer's own step counter, say) is torch's; one in gdn_core is ours."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []  # (what, "file:line")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        what = HOST_OPS.get(str(func))
        if str(func) == "aten._to_copy.default" and args[0].dtype == torch.int32:
            what = "copy of cu_seqlens"  # the step's only int32 tensor (train.packed_boundaries)
        if what is not None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename in PLUMBING:
                frame = frame.f_back
            where = "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
            self.seen.append((what, where))
        return func(*args, **(kwargs or {}))

    def ours(self) -> list[str]:
        """What gdn_core issued."""
        return [f"{what} at {where}" for what, where in self.seen
                if Path(where.rpartition(":")[0]).is_relative_to(GDN_CORE)]


def _tokens(cfg, train_cfg: TrainConfig) -> torch.Tensor:
    return torch.from_numpy(synthetic_tokens(batch_size=train_cfg.batch_size,
                                             seq_len=train_cfg.seq_len,
                                             vocab_size=cfg.vocab_size)).long()


def test_the_mode_sees_a_read_and_a_host_tensor_where_they_are_asked_for():
    x = torch.ones(3)
    cu_seqlens = torch.tensor([0, 2, 3], dtype=torch.int32)
    line = sys._getframe().f_lineno
    with HostSyncs() as mode:
        float(x.sum())
        f"{x.sum()}"
        torch.tensor([1, 2])
        cu_seqlens.long()
    assert mode.seen == [("read to the host", f"{__file__}:{line + 2}"),
                         ("read to the host", f"{__file__}:{line + 3}"),
                         ("tensor from host data", f"{__file__}:{line + 4}"),
                         ("copy of cu_seqlens", f"{__file__}:{line + 5}")]
    assert mode.ours() == []  # not gdn_core's


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layers, documents", [("gdn_only", "single"), ("hybrid", "single"),
                                               ("hybrid", "uniform:4-12")])
def test_one_chip_step_issues_no_host_sync(layers, documents):
    cfg = get_preset("tiny", layers=layers, num_layers=2)
    train_cfg = TrainConfig(batch_size=1, seq_len=32, documents=documents)
    model, optimizer = build_training(cfg, train_cfg)
    tokens = _tokens(cfg, train_cfg)
    step = dict(global_tokens=train_cfg.seq_len, dtype="float32",
                cu_seqlens=packed_boundaries(train_cfg))
    train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:], **step)  # warm-up
    with HostSyncs() as mode:
        loss = train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:], **step)
    assert isinstance(loss, torch.Tensor) and loss.shape == () and not loss.requires_grad
    assert mode.ours() == []


def _cp_step_job(rank: int, D: int, mode: str, documents: str) -> list[str]:
    # GDN Hk=1 < D: ulysses sends key head 0 to both ranks (an index); zigzag: the sequence
    # order and the rotary positions of each shard (indices); replicated: the overlapped sum;
    # packed documents: each layer's document starts from the host's cu_seqlens.
    tiny = get_preset("tiny", layers="hybrid", num_layers=2)
    cfg = dataclasses.replace(tiny, gdn=dataclasses.replace(tiny.gdn, num_k_heads=1,
                                                            num_v_heads=2))
    train_cfg = TrainConfig(batch_size=1, seq_len=8 * D, documents=documents)
    cp = CPSettings(mode=mode, chips=D, attn_cp="all_gather_kv", layout="zigzag")
    model, optimizer = build_cp_training(cfg, train_cfg, group=None, cp=cp)
    inputs, targets = shard_batch(_tokens(cfg, train_cfg), rank=rank, chips=D,
                                  layout=cp.layout)
    step = dict(global_tokens=train_cfg.seq_len, dtype="float32",
                grad_sync=gradient_sync(train_cfg.param_sharding, group=None),
                cu_seqlens=packed_boundaries(train_cfg))
    train_step(model, optimizer, inputs, targets, **step)  # warm-up
    with HostSyncs() as mode:
        train_step(model, optimizer, inputs, targets, **step)
    return mode.ours()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, documents", [("ulysses", "single"), ("p2p", "uniform:3-9")])
def test_cp_step_issues_no_host_sync(mode, documents):
    assert run_in_process_group(_cp_step_job, world_size=2, args=(mode, documents),
                                timeout_s=100) == [[], []]
