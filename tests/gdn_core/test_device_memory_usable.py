"""What a trial can allocate on a GPU, as the device reports it (gdn_core.device_memory):
torch.cuda.mem_get_info's total, JAX's bytes_limit at the trials' fraction, and never a CUDA
context or a JAX backend started for the asking. On this CPU-only host the devices are stand-ins
with the figures a card reports (an H100 80GB: 79.6 GiB of its datasheet's 80)."""

from __future__ import annotations

import pytest
import torch

from gdn_core import device_memory
from gdn_core.device_memory import (CUDA_CONTEXT_RESERVE_BYTES, JAX_GPU_MEMORY_FRACTION,
                                    gpu_usable_bytes_here, jax_gpu_allocator_env,
                                    jax_gpu_usable_bytes)

H100_REPORTED = 85_470_085_120  # bytes: about 79.6 GiB
H100_NAME = "NVIDIA H100 80GB HBM3"


class FakeJaxGpu:
    platform = "gpu"
    device_kind = H100_NAME

    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return {"bytes_limit": self.limit, "peak_bytes_in_use": 0}


def test_the_jax_fraction_has_one_owner_and_bytes_limit_counts_only_at_it(monkeypatch):
    assert jax_gpu_allocator_env() == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                       "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}
    limit = int(H100_REPORTED * JAX_GPU_MEMORY_FRACTION)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", str(JAX_GPU_MEMORY_FRACTION))
    usable, source = jax_gpu_usable_bytes(FakeJaxGpu(limit))
    assert usable == limit and "bytes_limit" in source and "=0.95" in source
    # At another fraction (JAX's 75% default) this process's limit is not a trial's.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")
    assert jax_gpu_usable_bytes(FakeJaxGpu(limit)) is None
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
    assert jax_gpu_usable_bytes(FakeJaxGpu(limit)) is None


def test_torch_reads_the_cards_total_where_it_already_uses_a_gpu_of_the_type(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: H100_NAME)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1, H100_REPORTED))
    usable, source = gpu_usable_bytes_here("torch", "h100")
    assert usable == H100_REPORTED - CUDA_CONTEXT_RESERVE_BYTES
    assert "mem_get_info total 79.6 GiB" in source and H100_NAME in source
    assert gpu_usable_bytes_here("torch", "h200") is None  # another type: not this card's


def test_nothing_is_read_where_the_process_has_no_gpu_in_use_and_no_context_is_made():
    assert not torch.cuda.is_initialized()
    assert gpu_usable_bytes_here("torch", "h100") is None
    assert gpu_usable_bytes_here("jax", "h100") is None  # JAX here has CPU devices only
    assert not torch.cuda.is_initialized()


def test_jax_reads_bytes_limit_of_a_gpu_of_the_type(monkeypatch):
    import jax

    limit = int(H100_REPORTED * JAX_GPU_MEMORY_FRACTION)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", str(JAX_GPU_MEMORY_FRACTION))
    monkeypatch.setattr(jax, "local_devices", lambda: [FakeJaxGpu(limit)])
    jax.devices()  # the backends are up, as in a process that runs JAX
    assert gpu_usable_bytes_here("jax", "h100-sxm") == jax_gpu_usable_bytes(FakeJaxGpu(limit))
    assert gpu_usable_bytes_here("jax", "a100") is None


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_device_that_fails_to_say_leaves_the_datasheet(monkeypatch, framework):
    def broken(*args, **kwargs):
        raise RuntimeError("driver gone")
    import jax

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", broken)
    monkeypatch.setattr(jax, "local_devices", lambda: [FakeJaxGpu(1)])
    monkeypatch.setattr(device_memory, "jax_gpu_usable_bytes", broken)
    jax.devices()
    assert gpu_usable_bytes_here(framework, "h100") is None
