"""Suite-wide set-up: 8 virtual CPU chips for JAX (must happen before JAX first runs), JAX's
persistent compilation cache, and the default tier's time budget per test (time_budget.py)."""

import os

from workers.compile_cache import default_jax_cache_dir, jax_cache_env

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The trial processes' cache directory (~/.cache/gdn-sweep/jax-compile unless
# GDN_SWEEP_JAX_CACHE_DIR says otherwise; empty turns it off): a program compiled by an earlier
# run, or by a trial process of this one, loads instead of compiling. Set in the environment so
# that processes the tests start inherit it. Entries are keyed by program, options and backend:
# a cold cache only costs time.
for name, value in jax_cache_env(default_jax_cache_dir()).items():
    os.environ.setdefault(name, value)
# Tests check numbers, not speed: XLA compiles without LLVM's optimisation passes (the same HLO,
# collectives and buffers; a CP step compiles in about half the time). Set in the environment so
# that the Ray trials and spawned ranks the tests start compile the same way.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))

# No GPU here: Triton compiles nothing, so its kernels (fla-core's, run by the interpreted-kernel
# tests) must be decorated in interpreter mode, which Triton decides when `triton` is first
# imported (torch._dynamo imports it). Set before anything imports it, here and in the processes
# the tests start; on a GPU host (scripts/device-check.sh's gpu tests) nothing changes.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

pytest_plugins = ["pytester", "tests.time_budget"]
