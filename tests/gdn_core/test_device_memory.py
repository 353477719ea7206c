"""Measured memory (gdn_core.device_memory): what each figure measures and how it is labelled.

CPU tests run here; the `gpu` ones run in scripts/device-check.sh (one CUDA device shared by
torch and JAX in one process) and also put the analytic predictor beside the device's own
allocator peak there.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from gdn_core import device_memory
from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.memory.step import predict_step_memory
from gdn_core.train_config import TrainConfig

MIB = 2 ** 20


# In a fresh interpreter: in the test process other threads (JAX's deferred frees, a pytest
# worker's) can release memory between the reset and the read, hiding the 64 MiB.
RSS_PEAK_CHECK = """
import numpy as np
from gdn_core import device_memory

MIB = 2 ** 20
assert device_memory.reset_peak_rss()  # Linux: /proc/self/clear_refs
before, source = device_memory.peak_rss()
block = np.ones(64 * MIB // 8)  # 64 MiB, touched
during, _ = device_memory.peak_rss()
assert source == "process_rss_peak" and during >= before + 60 * MIB, (before, during)
del block
device_memory.reset_peak_rss()
after, _ = device_memory.peak_rss()
assert after <= during - 60 * MIB, (during, after)  # the mark fell back to what is resident
per_chip, shared = device_memory.per_chip_rss(4)
assert shared == "process_rss_peak/4_chips"
assert abs(per_chip - device_memory.peak_rss()[0] / 4) <= MIB
assert device_memory.per_chip_rss(1)[1] == "process_rss_peak"
print("ok")
"""


@pytest.mark.timeout(60)
def test_rss_peak_is_reset_and_shared_over_chips():
    done = subprocess.run([sys.executable, "-c", RSS_PEAK_CHECK], capture_output=True,
                          text=True, timeout=50, cwd=pathlib.Path(__file__).parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_cpu_figures_of_both_frameworks_say_what_they_are():
    devices = jax.devices("cpu")[:4]
    assert device_memory.jax_reset_peak(devices) is None  # CPU: the RSS mark is reset instead
    peak, source = device_memory.jax_peak_memory(devices)
    assert peak > 0 and source == "process_rss_peak/4_chips"
    available = device_memory.host_available_bytes()
    capacity, capacity_source = device_memory.jax_chip_capacity(devices)
    assert capacity_source == "mem_available/4_chips"
    assert 0.5 * available / 4 <= capacity <= 2 * available / 4  # MemAvailable moves a little
    device_memory.torch_reset_peak("cpu")
    assert device_memory.torch_peak_memory("cpu")[1] == "process_rss_peak"
    capacity, capacity_source = device_memory.torch_chip_capacity("cpu", chips_on_host=2)
    assert capacity_source == "mem_available/2_chips" and capacity > 0


class StatsOnlyDevice:
    """A JAX device as far as device_memory reads one (platform, memory_stats): the stats
    layouts of GPU/TPU backends, which this host cannot produce."""

    platform = "gpu"

    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_accelerator_peak_is_new_or_labelled_lifetime():
    devices = [StatsOnlyDevice({"peak_bytes_in_use": 100, "bytes_limit": 1000}),
               StatsOnlyDevice({"peak_bytes_in_use": 300, "bytes_limit": 800})]
    baseline = device_memory.jax_reset_peak(devices)
    assert baseline == 300
    assert device_memory.jax_peak_memory(devices, baseline=baseline) == (
        300, "jax_peak_bytes_in_use_process_lifetime")  # no new high: may be an earlier run's
    devices[0].stats["peak_bytes_in_use"] = 500
    assert device_memory.jax_peak_memory(devices, baseline=baseline) == (
        500, "jax_peak_bytes_in_use")
    assert device_memory.jax_chip_capacity(devices) == (800, "jax_bytes_limit")
    silent = [StatsOnlyDevice(None), StatsOnlyDevice({})]
    assert device_memory.jax_peak_memory(silent) == (None, "unknown")
    assert device_memory.jax_chip_capacity(silent) == (None, "unknown")


# ----------------------------------------------------------------- on a CUDA device

# Activations dominate, so the prediction is tested where it is largest.
GPU_MODEL = ModelConfig(name="memory-gpu", gdn=GDNConfig(
    hidden_size=256, num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64,
    conv_kernel_size=4, chunk_size=64), num_layers=2, intermediate_size=512, vocab_size=1024)
GPU_TRAIN = TrainConfig(seq_len=8192)
PREDICTION_BOUNDS = (0.5, 2.0)
"""On a GPU the predictor has not been calibrated yet (CPU: XLA's analysis and torch's
allocator, within 0.8-1.25): this bound catches a wrong order of magnitude, the printout is
the calibration."""


@pytest.fixture(scope="module")
def jax_gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError as err:
        pytest.skip(f"JAX sees no GPU ({err}); JAX_PLATFORMS="
                    f"{os.environ.get('JAX_PLATFORMS')!r}")


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_cuda_peak_capacity_and_prediction():
    device_memory.torch_reset_peak("cuda")
    block = torch.ones(64 * MIB // 4, device="cuda")
    peak, source = device_memory.torch_peak_memory("cuda")
    assert source == "cuda_max_allocated" and peak >= 64 * MIB
    capacity, capacity_source = device_memory.torch_chip_capacity("cuda")
    assert capacity_source == "cuda_mem_get_info_total" and capacity > 16 * peak
    del block
    from gdn_core.torch_gdn.train import run_training

    report = run_training(GPU_MODEL, GPU_TRAIN, steps=1, warmup_steps=1, device="cuda")
    predicted = predict_step_memory(GPU_MODEL, GPU_TRAIN, mode="p2p", chips=1,
                                    framework="torch").total
    ratio = predicted / report.peak_memory_bytes
    print(f"torch cuda: measured {report.peak_memory_bytes} ({report.memory_source}), "
          f"predicted {predicted}, ratio {ratio:.3f}")
    assert report.memory_source == "cuda_max_allocated"
    assert PREDICTION_BOUNDS[0] <= ratio <= PREDICTION_BOUNDS[1]


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_jax_gpu_peak_capacity_and_prediction(jax_gpu):
    baseline = device_memory.jax_reset_peak([jax_gpu])
    block = jax.device_put(jnp.ones(256 * MIB // 4), jax_gpu).block_until_ready()
    peak, source = device_memory.jax_peak_memory([jax_gpu], baseline=baseline)
    assert peak >= 256 * MIB
    assert source in ("jax_peak_bytes_in_use", "jax_peak_bytes_in_use_process_lifetime")
    capacity, capacity_source = device_memory.jax_chip_capacity([jax_gpu])
    assert capacity_source == "jax_bytes_limit" and capacity > 4 * 256 * MIB
    del block
    from gdn_core.jax_gdn.train import run_training

    with jax.default_device(jax_gpu):
        report = run_training(GPU_MODEL, GPU_TRAIN, steps=1, warmup_steps=1)
    predicted = predict_step_memory(GPU_MODEL, GPU_TRAIN, mode="p2p", chips=1,
                                    framework="jax").total
    print(f"jax gpu: measured {report.peak_memory_bytes} ({report.memory_source}), XLA "
          f"{report.estimated_memory_bytes}, predicted {predicted}")
    assert report.memory_source.startswith("jax_peak_bytes_in_use")
    assert report.estimated_memory_source == "xla_memory_analysis"
    if report.memory_source == "jax_peak_bytes_in_use":  # this run set the peak: compare
        ratio = predicted / report.peak_memory_bytes
        assert PREDICTION_BOUNDS[0] <= ratio <= PREDICTION_BOUNDS[1], ratio
