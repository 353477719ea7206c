"""The sweep's own training step on one chip, reference beside fused, both frameworks.

    python -m gdn_core.bench step [--device cpu|cuda] [--preset qwen3.5-0.8b] [--layers N]
                                  [--seq-len 32768] [--batch 1] [--remat full]
                                  [--frameworks jax,torch] [--kernels reference,fused]
                                  [--dtypes bfloat16] [--steps 2] [--warmup 1]
                                  [--budget-s 270] [--out DIR] [--plan]

Each (dtype, framework, kernels) row runs `run_cp_training` of its framework, the function a
sweep's trial runs, on one chip (CPSettings(mode="p2p", chips=1): no exchange; torch in a
one-rank process group, JAX on a one-device mesh), for the preset as the hybrid decoder
(GDN layers with a gated full-attention layer every 4th: at full depth and 32K tokens GDN and
attention hold more than half the model FLOPs, the LM head about a fifth). Each row is a child
process of its own, so its memory peak is its own and a crash or out-of-memory loses that
row only. The rows share --budget-s (each gets what the rows before it left).

Memory (step_plan.py): the table prints its plan first, each row's predicted memory per chip
(gdn_core.memory.step.predict_step_memory, kernels-aware) against an H100 80GB and an H200
141GB; --plan prints only that (no GPU, no compile). A row's child compares the prediction
with what its own device says it can allocate before it starts, and a row over it is skipped.
remat defaults to full: qwen3.5-0.8b's hybrid at 32K tokens needs about 202 GiB (torch) and
310 GiB (JAX) per chip without it, about 27 and 32 GiB with it.

Warm-up: --warmup must be at least 1 when a row runs kernels "fused": a library kernel tunes
itself on its first call (fla's Triton autotune), which a timed step must never include.

A row ends in one of four states:
  ok           measured
  skipped      kernels="fused" that no kernel serves here (KernelUnavailable: its reason),
               or predicted over what the device can allocate ("predicted X GiB > usable Y GiB")
  failed       an error, a non-finite loss, or MFU > 1 (impossible: the time or peak is wrong)
  not reached  the budget was spent by the rows before it
Exit code 1 only when a row failed: a cold machine that runs out of budget still reports the
rows it finished and exits 0.

Columns (docs/architecture.md, Metrics):
  step s       median wall time of the measured steps (after warm-up), device synchronised
  tokens/s     batch × seq_len / step s
  MFU          gdn_core.flops.model.model_flops_per_step (independent of the kernels) /
               (step s × peak). Peak: the GPU's datasheet figure in the row's dtype
               (datasheets.peak_flops_per_chip); on CPU, or a GPU the table lacks, a GEMM
               calibration in the row's framework and dtype on that device
  mem GiB      the run's measured peak (gdn_core.device_memory: CUDA's allocator peak, JAX's
               peak_bytes_in_use; on CPU the process RSS), its source printed below the table
  compile s    JAX: lowering and compiling the step
  GDN / attention kernel: what the row ran (gdn_core.kernels.resolve_kernels, with versions)

With --out (default: $OUT when set) the rows are also written as step-table.json and
step-table.md there. fla's rule beside ours, alone, is the kernel benchmark's job
(python -m gdn_core.bench kernel), which scripts/device-check.sh runs before this one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from ..device_memory import jax_gpu_allocator_env
from ..train_config import FRAMEWORKS
from .step_plan import (format_plan, memory_refusal, plan_rows,
                        predicted_memory, usable_here)
from .step_table import format_table, write_outputs

DTYPES = ("bfloat16", "float32")
ROW_PREFIX = "STEP_ROW_JSON "
"""Marks the line on which a row's child process prints its result."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepRow:
    """One (dtype, framework, kernels) row; `status` says whether it was measured."""

    framework: str
    kernels: str
    dtype: str
    preset: str
    layers: int
    seq_len: int
    batch: int
    remat: str = "none"
    predicted_memory_bytes: int | None = None
    """gdn_core.memory.step.predict_step_memory of the row (kernels-aware)."""
    status: str = "ok"
    """ok | skipped (no kernel serves the point, or predicted over the device's memory) |
    failed | not reached (budget spent)."""
    reason: str | None = None
    """Why the row is skipped, failed or not reached."""
    device_name: str = ""
    gdn_kernel: str = ""
    attention_kernel: str | None = None
    step_time_s: float | None = None
    step_times_s: list[float] = dataclasses.field(default_factory=list)
    tokens_per_s: float | None = None
    model_flops_per_step: int | None = None
    peak_flops_per_s: float | None = None
    peak_source: str = ""
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    memory_source: str = ""
    compile_time_s: float | None = None
    losses: list[float] = dataclasses.field(default_factory=list)
    wall_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def build_parser() -> argparse.ArgumentParser:
    from ..kernels import KERNELS

    p = argparse.ArgumentParser(prog="python -m gdn_core.bench step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--preset", default="qwen3.5-0.8b", help="a gdn_core.presets name")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers (default: the preset's full depth)")
    p.add_argument("--seq-len", type=int, default=32768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--remat", choices=("none", "gdn", "full"), default="full",
                   help="activation recomputation (full: each decoder layer)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                   help=f"comma-separated, from: {', '.join(FRAMEWORKS)}")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help=f"comma-separated, from: {', '.join(KERNELS)}")
    p.add_argument("--dtypes", default="bfloat16",
                   help=f"comma-separated, from: {', '.join(DTYPES)}")
    p.add_argument("--steps", type=int, default=2, help="measured steps per row")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per row (compiles)")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="wall-clock seconds for all rows together")
    p.add_argument("--out", default=os.environ.get("OUT") or None,
                   help="directory for step-table.json / .md (default: $OUT when set)")
    p.add_argument("--plan", action="store_true",
                   help="print each row's predicted memory against an H100 80GB and an H200 "
                        "141GB and exit (no GPU, no compile)")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # dtype:framework:kernels
    return p


def _choices(text: str, allowed: Sequence[str], option: str) -> list[str]:
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in chosen if x not in allowed]
    if bad or not chosen:
        raise SystemExit(f"{option}={text!r}: {bad or 'empty'} not among {', '.join(allowed)}")
    return chosen


# --------------------------------------------------------------------------- one row (a child)

def _model_cfg(args):
    from ..presets import get_preset

    return get_preset(args.preset, num_layers=args.layers, layers="hybrid")


def _torch_row(args, model_cfg, train_cfg, cp) -> dict:
    import torch
    import torch.distributed as dist

    from .. import calibration
    from ..torch_gdn.cp.train import run_cp_training
    from .ranks import free_port

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{free_port()}")
    try:
        report = run_cp_training(model_cfg, train_cfg, group=None, cp=cp, steps=args.steps,
                                 warmup_steps=args.warmup, device=args.device)
    finally:
        dist.destroy_process_group()
    if args.device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = f"cpu ({torch.get_num_threads()} torch threads)"
    peak = _datasheet_peak(name, train_cfg.dtype)
    if peak is None:
        measured = calibration.measure_gemm_flops_per_s(
            device=args.device, seconds=1.0, size=calibration.CALIBRATION_GEMM_SIZE[args.device],
            dtype=train_cfg.dtype)
        peak = measured.flops_per_s, measured.source
    return dict(report=report, device_name=name, peak=peak)


def _jax_row(args, model_cfg, train_cfg, cp) -> dict:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from .. import calibration
    from ..jax_gdn.cp.train import run_cp_training

    platform = "gpu" if args.device == "cuda" else "cpu"
    try:
        device = jax.devices(platform)[0]
    except RuntimeError as err:
        raise RuntimeError(f"JAX has no {platform} device ({err}); JAX_PLATFORMS="
                           f"{os.environ.get('JAX_PLATFORMS')!r} (a GPU needs '' or 'cuda,cpu')") from err
    mesh = Mesh(np.array([device]), ("cp",))
    report = run_cp_training(model_cfg, train_cfg, mesh=mesh, axis="cp", cp=cp,
                             steps=args.steps, warmup_steps=args.warmup)
    name = device.device_kind if platform == "gpu" else f"cpu ({device.device_kind})"
    peak = _datasheet_peak(name, train_cfg.dtype)
    if peak is None:
        gemm = calibration.measure_jax_gemm_flops_per_s(
            device=device, seconds=1.0, size=calibration.CALIBRATION_GEMM_SIZE[args.device],
            dtype=train_cfg.dtype)
        peak = gemm.flops_per_s, gemm.source
    return dict(report=report, device_name=name, peak=peak)


def _datasheet_peak(device_name: str, dtype: str) -> tuple[float, str] | None:
    """(FLOP/s, source) from the datasheet table, or None for a chip it lacks (a CPU)."""
    from .. import datasheets
    from ..device_names import accelerator_type_from_device_name

    kind = accelerator_type_from_device_name(device_name)
    if kind is None:
        return None
    return datasheets.peak_flops_per_chip(kind, dtype), datasheets.peak_source(kind, dtype)


def _row_base(args, model_cfg, dtype: str, framework: str, kernels: str) -> dict:
    predicted = predicted_memory(model_cfg, batch=args.batch, seq_len=args.seq_len,
                                 dtype=dtype, remat=args.remat, framework=framework,
                                 kernels=kernels).total
    return dict(framework=framework, kernels=kernels, dtype=dtype, preset=args.preset,
                layers=model_cfg.num_layers, seq_len=args.seq_len, batch=args.batch,
                remat=args.remat, predicted_memory_bytes=predicted)


def run_row(args, dtype: str, framework: str, kernels: str) -> StepRow:
    """Run one row in this process (the child's work) and return it, complete."""
    from ..cp_modes import CPSettings
    from ..flops.model import model_flops_per_step
    from ..kernels import KernelUnavailable, resolve_kernels
    from ..train_config import TrainConfig

    model_cfg = _model_cfg(args)
    base = _row_base(args, model_cfg, dtype, framework, kernels)
    train_cfg = TrainConfig(batch_size=args.batch, seq_len=args.seq_len, dtype=dtype,
                            remat=args.remat)
    try:  # the rule book first, as a sweep's worker does; the step resolves what it runs
        resolve_kernels(framework, kernels,
                                   device_kind="gpu" if args.device == "cuda" else "cpu",
                                   dtype=dtype, head_dim=model_cfg.attention.head_dim,
                                   has_attention=True)
        # Then the memory, against what this row's device says it can give: a row predicted
        # over it would only run out of memory after its model is built.
        refusal = memory_refusal(base["predicted_memory_bytes"],
                                 *usable_here(args.device, framework))
        if refusal is not None:
            return StepRow(**base, status="skipped", reason=refusal)
        cp = CPSettings.one_chip(kernels=kernels)
        got = (_torch_row if framework == "torch" else _jax_row)(args, model_cfg, train_cfg, cp)
    except KernelUnavailable as err:
        return StepRow(**base, status="skipped", reason=str(err))
    report = got["report"]
    step_time = report.step_time_s
    model_flops = model_flops_per_step(model_cfg, batch=args.batch, seq_len=args.seq_len).total
    peak_flops, peak_source = got["peak"]
    mfu = model_flops / (step_time * peak_flops)
    status, reason = "ok", None
    if not all(math.isfinite(x) for x in report.losses):
        status, reason = "failed", f"non-finite loss: {report.losses}"
    elif mfu > 1:
        status, reason = "failed", (f"MFU {mfu:.3f} > 1 is impossible: the step time or the "
                                    "peak is wrong")
    return StepRow(
        **base, status=status, reason=reason, device_name=got["device_name"],
        gdn_kernel=report.gdn_kernel, attention_kernel=report.attention_kernel,
        step_time_s=step_time, step_times_s=list(report.step_times_s),
        tokens_per_s=args.batch * args.seq_len / step_time, model_flops_per_step=model_flops,
        peak_flops_per_s=peak_flops, peak_source=peak_source, mfu=mfu,
        peak_memory_bytes=report.peak_memory_bytes, memory_source=report.memory_source,
        compile_time_s=report.compile_time_s, losses=list(report.losses))


# --------------------------------------------------------------------------- the table (parent)

def _child_argv(args, dtype: str, framework: str, kernels: str) -> list[str]:
    argv = [sys.executable, "-m", "gdn_core.bench", "step", "--row",
            f"{dtype}:{framework}:{kernels}", "--device", args.device, "--preset", args.preset,
            "--seq-len", str(args.seq_len), "--batch", str(args.batch), "--remat", args.remat,
            "--steps", str(args.steps), "--warmup", str(args.warmup)]
    return argv + (["--layers", str(args.layers)] if args.layers is not None else [])


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def run_row_in_child(args, dtype: str, framework: str, kernels: str, *,
                     timeout_s: float) -> StepRow:
    """Run one row in a fresh Python process; a crash or timeout becomes the row's reason."""
    base = _row_base(args, _model_cfg(args), dtype, framework, kernels)
    if timeout_s <= 0:
        return StepRow(**base, status="not reached",
                       reason="--budget-s spent by the rows before it")
    start = time.perf_counter()
    env = dict(os.environ)
    if args.device == "cuda":  # JAX at the trials' stated fraction, not its 75% default
        env.update(jax_gpu_allocator_env())
    try:
        done = subprocess.run(_child_argv(args, dtype, framework, kernels), capture_output=True,
                              text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as err:
        return StepRow(**base, status="not reached", wall_s=time.perf_counter() - start,
                       reason=f"stopped at the budget's end after {timeout_s:.0f} s: "
                              f"{_tail(str(err.stderr or ''), 2)}")
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(ROW_PREFIX)]
    if done.returncode != 0 or not lines:
        return StepRow(**base, status="failed", wall_s=wall,
                       reason=f"exit {done.returncode}: {_tail(done.stderr or done.stdout)}")
    fields = json.loads(lines[-1][len(ROW_PREFIX):])
    return StepRow(**{**fields, "wall_s": wall})


def main(argv: Sequence[str] | None = None) -> int:
    from ..kernels import KERNELS

    args = build_parser().parse_args(argv)
    if args.row is not None:  # a child: one row, printed as JSON on the marked line
        row = run_row(args, *args.row.split(":"))
        print(ROW_PREFIX + json.dumps(dataclasses.asdict(row)), flush=True)
        return 0
    dtypes = _choices(args.dtypes, DTYPES, "--dtypes")
    frameworks = _choices(args.frameworks, FRAMEWORKS, "--frameworks")
    kernels = _choices(args.kernels, KERNELS, "--kernels")
    if "fused" in kernels and args.warmup < 1:
        raise SystemExit(f"--warmup={args.warmup} with --kernels including fused: a fused "
                         "kernel tunes itself on its first call (fla's Triton autotune), which "
                         "must not be timed; use --warmup >= 1")
    model_cfg = _model_cfg(args)
    plan = plan_rows(model_cfg, preset=args.preset, batch=args.batch, seq_len=args.seq_len,
                     remat=args.remat, dtypes=dtypes, frameworks=frameworks, kernels=kernels)
    print(f"memory plan: {args.preset} hybrid with {model_cfg.num_layers} layers, "
          f"B={args.batch} T={args.seq_len}, remat {args.remat}\n{format_plan(plan)}",
          flush=True)
    if args.plan:
        return 0
    print(f"the sweep's step on one chip: {args.preset} hybrid with {model_cfg.num_layers} "
          f"layers, B={args.batch} T={args.seq_len}, remat {args.remat}, device={args.device}, "
          f"{args.warmup} warm-up + {args.steps} measured steps, budget {args.budget_s:.0f} s",
          flush=True)
    deadline = time.perf_counter() + args.budget_s
    rows = []
    for dtype in dtypes:
        for framework in frameworks:
            for kernel in kernels:
                row = run_row_in_child(args, dtype, framework, kernel,
                                       timeout_s=deadline - time.perf_counter())
                print(f"  {framework} {kernel} {dtype}: {row.status}"
                      + (f" ({row.wall_s:.0f} s)" if row.wall_s is not None else "")
                      + (f": {row.reason}" if row.reason else ""), flush=True)
                rows.append(row)
    print(format_table(rows))
    if args.out:
        for path in write_outputs(rows, args.out):
            print(f"wrote {path}")
    return 1 if any(row.status == "failed" for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
