"""What this process runs on: package versions and the devices torch and JAX see.

    python -m gdn_core.bench env

Printed first by scripts/device-check.sh, so a device run's log says which torch, CUDA, JAX,
Triton and fla produced its numbers. The last line is machine-readable:
`devices: cuda=<0|1> jax_gpu=<0|1>` (torch sees a CUDA device; JAX has a GPU backend).
Versions come from the installed distributions' metadata (nothing heavy is imported for them);
JAX's devices need its backends, which honour JAX_PLATFORMS.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Sequence

DISTRIBUTIONS = ("numpy", "torch", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin",
                 "optax", "transformers", "triton", "pytorch-triton", "fla-core",
                 "flash-linear-attention", "einops", "pytest", "pytest-timeout")
"""Distributions whose versions are printed when installed (or found on PYTHONPATH)."""


def versions() -> dict[str, str]:
    """{distribution: version} of those in DISTRIBUTIONS that are present."""
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def torch_devices() -> list[str]:
    """Lines describing torch's CUDA devices (empty without one)."""
    import torch

    lines = [f"torch {torch.__version__}, built for CUDA {torch.version.cuda}"]
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(i)
        lines.append(f"cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB, "
                     f"compute capability {props.major}.{props.minor}")
    return lines


def jax_devices() -> tuple[list[str], bool]:
    """(lines describing JAX's devices, whether it has a GPU backend)."""
    import jax

    lines = [f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}, default backend "
             f"{jax.default_backend()}"]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as err:
        return lines + [f"JAX has no GPU backend: {err}"], False
    return lines + [f"JAX {d.id}: {d.device_kind} ({d.platform})" for d in gpus], True


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # no options
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{os.cpu_count()} CPUs visible")
    print("versions: " + ", ".join(f"{name} {v}" for name, v in versions().items()))
    lines = torch_devices()
    cuda = len(lines) > 1
    print("\n".join(lines))
    if not cuda:
        print("no CUDA device: torch.cuda.is_available() is False")
    try:
        jax_lines, jax_gpu = jax_devices()
    except Exception as err:  # noqa: BLE001 - e.g. JAX_PLATFORMS names a missing plugin
        jax_lines, jax_gpu = [f"JAX failed to initialise: {type(err).__name__}: {err}"], False
    print("\n".join(jax_lines))
    print(f"devices: cuda={int(cuda)} jax_gpu={int(jax_gpu)}")
    return 0
