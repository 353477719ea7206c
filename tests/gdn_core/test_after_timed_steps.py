"""run_cp_training's after_timed_steps hook, in both frameworks: called once, after every
figure is read, with a callable that runs one real extra training step; nothing of that step
reaches the report — not its time, not its loss. (That every rank of a multi-rank trial runs
it is tests/workers/test_profiling.py's: a rank that did not would hang the others.)"""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core.cp_modes import CPSettings
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig

from .torch_dist import free_port

MODEL = get_preset("tiny", num_layers=1)
TRAIN = TrainConfig(batch_size=1, seq_len=64)
STEPS, WARMUP = 2, 1
PAUSE_S = 0.5
"""The hook waits this long around the extra step: were the hook inside a timed step, that
step's time would show it (a tiny step takes milliseconds here)."""


def _slow_hook(calls: list):
    def hook(step) -> None:
        time.sleep(PAUSE_S)
        started = time.perf_counter()
        step()
        calls.append(time.perf_counter() - started)

    return hook


def _torch_one_rank() -> dict:
    import torch.distributed as dist
    from torch.profiler import profile

    from gdn_core.torch_gdn.cp.train import run_cp_training

    calls: list[float] = []
    ops: set[str] = set()

    def hook(step):
        with profile() as prof:  # what the extra step ran
            _slow_hook(calls)(step)
        ops.update(event.key for event in prof.key_averages())

    report = run_cp_training(MODEL, TRAIN, group=dist.group.WORLD,
                             cp=CPSettings(mode="all_gather", chips=1), steps=STEPS,
                             warmup_steps=WARMUP, after_timed_steps=hook)
    return dict(calls=calls, step_times_s=report.step_times_s, losses=report.losses,
                ops=sorted(ops))


@pytest.mark.timeout(120)
def test_torch_extra_step_runs_outside_the_report():
    import torch.distributed as dist

    # one rank in this process (a spawned group costs ~10 s of imports on this host)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        results = [_torch_one_rank()]
    finally:
        dist.destroy_process_group()
    for rank in results:
        assert len(rank["calls"]) == 1
        # a real training step ran: forward and backward matmuls, the optimizer
        assert {"aten::mm", "Optimizer.step#AdamW.step"} <= set(rank["ops"])
        assert len(rank["step_times_s"]) == STEPS
        assert len(rank["losses"]) == WARMUP + STEPS  # the extra step's loss is not recorded
        assert max(rank["step_times_s"]) < PAUSE_S  # the hook's time is in no measured step


@pytest.mark.timeout(120)
def test_torch_extra_step_of_a_packed_trial_is_the_packed_step(monkeypatch):
    """The step after_timed_steps runs (the profiled one) takes the trial's packed-document
    boundaries, as every timed step does: a profile of a packed trial profiles a packed step."""
    import dataclasses

    import torch.distributed as dist

    from gdn_core.torch_gdn.cp import train

    seen = []

    def recording_step(*args, **kwargs):
        seen.append(kwargs.get("cu_seqlens"))
        return real_step(*args, **kwargs)

    real_step = train.train_step
    monkeypatch.setattr(train, "train_step", recording_step)
    packed = dataclasses.replace(TRAIN, documents="uniform:8-24")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        train.run_cp_training(MODEL, packed, group=dist.group.WORLD,
                              cp=CPSettings(mode="p2p", chips=1), steps=STEPS,
                              warmup_steps=WARMUP, after_timed_steps=lambda step: step())
    finally:
        dist.destroy_process_group()
    assert len(seen) == WARMUP + STEPS + 1
    assert seen[0] is not None and seen[0].numel() > 2  # several documents
    assert all(cu is not None and cu.tolist() == seen[0].tolist() for cu in seen), seen


@pytest.mark.slow  # compiling the step takes ~30 s on a shared 2-core host
@pytest.mark.timeout(180)
def test_jax_extra_step_runs_outside_the_report():
    from gdn_core.jax_gdn.cp.train import run_cp_training

    calls: list[float] = []
    mesh = Mesh(np.array(jax.devices()[:2]), ("cp",))
    report = run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp",
                             cp=CPSettings(mode="all_gather", chips=2), steps=STEPS,
                             warmup_steps=WARMUP, after_timed_steps=_slow_hook(calls))
    assert len(calls) == 1
    assert len(report.step_times_s) == STEPS and len(report.losses) == WARMUP + STEPS
    assert max(report.step_times_s) < PAUSE_S
