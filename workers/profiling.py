"""Profile one extra training step of a trial (`SweepSpec.profile`), in the process that runs it.

gdn_core's run_cp_training hands `after_timed_steps` a callable that runs one more step after
every figure of the trial is read, so the profile changes no recorded metric. Every process
must run that step (its collectives span the mesh); process 0 runs it under its framework's
profiler and keeps the trace:
- torch: torch.profiler (CPU activity, plus CUDA on a GPU), exported with export_chrome_trace
  and gzipped: a `.pt.trace.json.gz` that Perfetto (ui.perfetto.dev), chrome://tracing and
  TensorBoard's PyTorch profiler plugin open.
- JAX: jax.profiler.trace(create_perfetto_trace=True): the TensorBoard profile run directory
  (`plugins/profile/<run>/<host>.xplane.pb`, XProf's own format, plus the Perfetto trace
  `perfetto_trace.json.gz`) as a `.xprof.tar.gz`: unpack it and run `xprof --logdir DIR`
  (or TensorBoard), or open the perfetto file in Perfetto.
The summary (workers.profile_summary) is read from the Chrome-format trace of either.
A profiler that fails to start or export leaves the step run and the error in the capture:
the trial's measurements stand either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import pathlib
import tarfile
import tempfile
import time
from collections.abc import Callable

from gdn_core.train_config import check_framework

from .profile_summary import summarise_trace

CHROME_TRACE = "chrome_trace_json_gz"
"""torch: one Chrome / Perfetto trace, gzipped JSON."""
XPROF_RUN = "xprof_run_tar_gz"
"""JAX: a TensorBoard / XProf profile run directory (xplane.pb + perfetto trace), tar.gz."""
SUFFIX = {CHROME_TRACE: ".pt.trace.json.gz", XPROF_RUN: ".xprof.tar.gz"}
"""File name ending of each stored format."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CapturedProfile:
    """What process 0 kept of the profiled step (crosses Ray to the driver)."""

    format: str
    """CHROME_TRACE or XPROF_RUN."""
    data: bytes = b""
    """The file to store; empty when the profiler failed."""
    summary: dict = dataclasses.field(default_factory=dict)
    """workers.profile_summary.summarise_trace of the step."""
    error: str | None = None
    """Why there is no trace (the profiler failed; the step still ran)."""


class StepProfiler:
    """The after_timed_steps hook of one process: runs the extra step, under the profiler in
    process 0 (`enabled`); `captured` holds the result there afterwards."""

    def __init__(self, *, framework: str, enabled: bool, device: str = "cpu") -> None:
        check_framework(framework)
        self.framework, self.enabled, self.device = framework, enabled, device
        self.captured: CapturedProfile | None = None

    def __call__(self, step: Callable[[], None]) -> None:
        if not self.enabled:
            step()
            return
        with tempfile.TemporaryDirectory(prefix="gdn-sweep-profile-") as tmp:
            profile = torch_profile if self.framework == "torch" else jax_profile
            self.captured = profile(step, pathlib.Path(tmp), device=self.device)


def _failed(fmt: str, stage: str, err: BaseException) -> CapturedProfile:
    return CapturedProfile(format=fmt, error=f"the profiler failed {stage}: "
                                             f"{type(err).__name__}: {err}")


def torch_profile(step: Callable[[], None], tmp: pathlib.Path, *,
                  device: str = "cpu") -> CapturedProfile:
    """Run `step` under torch.profiler; the gzipped Chrome trace and its summary."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda") and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(activities=activities)
    try:
        profiler.__enter__()
    except Exception as err:  # noqa: BLE001 - the step must run: the other ranks wait on it
        step()
        return _failed(CHROME_TRACE, "to start", err)
    start = time.perf_counter()
    try:
        step()
    finally:
        wall_s = time.perf_counter() - start
        profiler.__exit__(None, None, None)
    try:
        path = tmp / "trace.json"
        profiler.export_chrome_trace(str(path))
        raw = path.read_bytes()
        summary = summarise_trace(json.loads(raw), framework="torch", wall_s=wall_s)
    except Exception as err:  # noqa: BLE001 - the measurements stand without a trace
        return _failed(CHROME_TRACE, "to export", err)
    return CapturedProfile(format=CHROME_TRACE, data=gzip.compress(raw), summary=summary)


def jax_profile(step: Callable[[], None], tmp: pathlib.Path, *,
                device: str = "cpu") -> CapturedProfile:
    """Run `step` under jax.profiler.trace; the profile run directory as tar.gz, and the
    summary of its perfetto trace."""
    import jax

    stack = contextlib.ExitStack()
    try:
        stack.enter_context(jax.profiler.trace(str(tmp), create_perfetto_trace=True))
    except Exception as err:  # noqa: BLE001 - the step must run: the other processes wait
        step()
        return _failed(XPROF_RUN, "to start", err)
    with stack:
        start = time.perf_counter()
        step()
        wall_s = time.perf_counter() - start
    try:
        perfetto = next(tmp.glob("plugins/profile/*/perfetto_trace.json.gz"))
        summary = summarise_trace(json.loads(gzip.decompress(perfetto.read_bytes())),
                                  framework="jax", wall_s=wall_s)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(tmp / "plugins", arcname="plugins")
    except Exception as err:  # noqa: BLE001 - the measurements stand without a trace
        return _failed(XPROF_RUN, "to export", err)
    return CapturedProfile(format=XPROF_RUN, data=buffer.getvalue(), summary=summary)


__all__ = ["CHROME_TRACE", "CapturedProfile", "SUFFIX", "StepProfiler", "XPROF_RUN",
           "jax_profile", "torch_profile"]
