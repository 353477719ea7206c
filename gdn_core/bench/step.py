"""One-chip training step of both frameworks on a preset shape, in one table.

    python -m gdn_core.bench step [--device cpu|cuda] [--preset qwen3.5-0.8b] [--layers 2]
                                  [--seq-len 16384] [--batch 1] [--frameworks torch,jax]
                                  [--dtypes bfloat16,float32] [--steps 3] [--warmup 1]
                                  [--rule-repeats 3] [--budget-s 150] [--out DIR]

Each (framework, dtype) row runs the public training step (torch_gdn.run_training,
jax_gdn.run_training: AdamW, fp32 master weights, chunked cross-entropy) in a child process
of its own, so its memory peak is its own and a crash or an out-of-memory loses that row only.
The rows share --budget-s: each gets what the rows before it left; rows not reached in time
are reported as such. Rows run dtype by dtype (bf16 first: the dtype a team trains in).

Columns (ARCHITECTURE.md, Metrics):
  step s        median wall time of the measured steps (after warm-up), device synchronised
  tokens/s      batch × seq_len / step s (one chip)
  MFU           gdn_core.flops.model.model_flops_per_step / (step s × peak). Peak: the GPU's
                datasheet figure in the row's dtype (hardware.peak_flops_per_chip; float32 is
                FP32 without TF32); on CPU, or a GPU the table lacks, a GEMM calibration in the
                row's framework and dtype on that device
  mem GiB       the step's measured peak as run_training reports it (gdn_core.device_memory):
                torch.cuda.max_memory_allocated, JAX device.memory_stats()["peak_bytes_in_use"];
                on CPU the row process's peak RSS (a source named process_rss…)
  xla est GiB   JAX only: XLA's compile-time estimate of the step, as its own figure
  compile s     JAX only: seconds spent lowering and compiling the step
  rule TFLOP/s  3 × gdn_rule_flops of one layer's rule (B, T, Hk, Hv, Dk, Dv of the preset)
                over the median fwd+bwd time of that rule alone, timed with the kernel
                benchmark's runners (gdn_core.bench.kernel) in the row's framework and dtype
  rule share    layers × that rule time / step s: the share of the step spent in the rule

With --out (default: $OUT when set) the rows are also written as step-table.json and
step-table.md there. Exit code 0 when every row ran and reported a finite loss and MFU ≤ 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence

FRAMEWORKS = ("torch", "jax")
DTYPES = ("bfloat16", "float32")
ROW_PREFIX = "STEP_ROW_JSON "
"""Marks the line on which a row's child process prints its result."""
GEMM_SIZE = {"cpu": 1024, "cuda": 8192}
"""Side of the square GEMMs of a peak calibration, per device."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepRow:
    """One (framework, dtype) row of the table; error set when the row did not complete."""

    framework: str
    dtype: str
    preset: str
    layers: int
    seq_len: int
    batch: int
    device_name: str = ""
    step_time_s: float | None = None
    step_times_s: list[float] = dataclasses.field(default_factory=list)
    tokens_per_s: float | None = None
    model_flops_per_step: int | None = None
    peak_flops_per_s: float | None = None
    peak_source: str = ""
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    memory_source: str = ""
    xla_estimate_bytes: int | None = None
    compile_time_s: float | None = None
    rule_time_s: float | None = None
    rule_flops_per_s: float | None = None
    rule_share: float | None = None
    losses: list[float] = dataclasses.field(default_factory=list)
    wall_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gdn_core.bench step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--preset", default="qwen3.5-0.8b", help="a gdn_core.presets name")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers (default: the preset's full depth)")
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                   help=f"comma-separated, from: {', '.join(FRAMEWORKS)}")
    p.add_argument("--dtypes", default=",".join(DTYPES),
                   help=f"comma-separated, from: {', '.join(DTYPES)}")
    p.add_argument("--steps", type=int, default=3, help="measured steps per row")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per row (compiles)")
    p.add_argument("--rule-repeats", type=int, default=3, help="timed runs of the rule alone")
    p.add_argument("--budget-s", type=float, default=150.0,
                   help="wall-clock seconds for all rows together")
    p.add_argument("--out", default=os.environ.get("OUT") or None,
                   help="directory for step-table.json / .md (default: $OUT when set)")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # framework:dtype, a child
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

    return get_preset(args.preset, num_layers=args.layers)


def _rule_arrays(model_cfg, args):
    from .kernel import make_inputs

    gdn = model_cfg.gdn
    return make_inputs(batch=args.batch, seq_len=args.seq_len, num_k_heads=gdn.num_k_heads,
                       num_v_heads=gdn.num_v_heads, head_k_dim=gdn.head_k_dim,
                       head_v_dim=gdn.head_v_dim)


def _median_rule_time(run, repeats: int) -> float:
    from .kernel import time_alternating

    times = time_alternating({"rule": run}, warmup=1, repeats=repeats)["rule"]
    return sorted(times)[len(times) // 2]


def _torch_row(args, model_cfg, train_cfg) -> dict:
    import torch

    from .. import hardware
    from ..torch_gdn import chunk_gated_delta_rule, run_training
    from .kernel import TORCH_DTYPES, torch_rule_runner

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device")
    report = run_training(model_cfg, train_cfg, steps=args.steps, warmup_steps=args.warmup,
                          device=args.device)
    run = torch_rule_runner(chunk_gated_delta_rule, _rule_arrays(model_cfg, args),
                            device=args.device, dtype=TORCH_DTYPES[train_cfg.dtype],
                            chunk_size=model_cfg.gdn.chunk_size, transformers_api=False)
    rule_time = _median_rule_time(run, args.rule_repeats)
    if args.device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = f"cpu ({torch.get_num_threads()} torch threads)"
    peak = _datasheet_peak(name, train_cfg.dtype)
    if peak is None:
        measured = hardware.measure_gemm_flops_per_s(device=args.device, seconds=1.0,
                                                     size=GEMM_SIZE[args.device],
                                                     dtype=train_cfg.dtype)
        peak = measured.flops_per_s, measured.source
    return dict(report=report, rule_time=rule_time, device_name=name, peak=peak)


def _jax_row(args, model_cfg, train_cfg) -> dict:
    import jax

    from .. import hardware
    from ..jax_gdn import run_training
    from .kernel import jax_rule_runner

    platform = "gpu" if args.device == "cuda" else "cpu"
    try:
        device = jax.devices(platform)[0]
    except RuntimeError as err:
        raise RuntimeError(f"JAX has no {platform} device ({err}); JAX_PLATFORMS="
                           f"{os.environ.get('JAX_PLATFORMS')!r} (a GPU needs '' or 'cuda,cpu')") from err
    with jax.default_device(device):
        report = run_training(model_cfg, train_cfg, steps=args.steps, warmup_steps=args.warmup)
    run, _ = jax_rule_runner(_rule_arrays(model_cfg, args), device=args.device,
                             dtype=train_cfg.dtype, chunk_size=model_cfg.gdn.chunk_size)
    rule_time = _median_rule_time(run, args.rule_repeats)
    name = device.device_kind if platform == "gpu" else f"cpu ({device.device_kind})"
    peak = _datasheet_peak(name, train_cfg.dtype)
    if peak is None:
        gemm = hardware.measure_jax_gemm_flops_per_s(device=device, seconds=1.0,
                                                     size=GEMM_SIZE[args.device],
                                                     dtype=train_cfg.dtype)
        peak = gemm.flops_per_s, gemm.source
    return dict(report=report, rule_time=rule_time, device_name=name, peak=peak)


def _datasheet_peak(device_name: str, dtype: str) -> tuple[float, str] | None:
    """(FLOP/s, source) from the datasheet table, or None for a chip it lacks (a CPU)."""
    from .. import hardware

    kind = hardware.accelerator_type_from_device_name(device_name)
    if kind is None:
        return None
    return hardware.peak_flops_per_chip(kind, dtype), hardware.peak_source(kind, dtype)


def run_row(args, framework: str, dtype: str) -> StepRow:
    """Run one row in this process (the child's work) and return it, complete."""
    from ..flops.model import gdn_rule_flops, model_flops_per_step
    from ..train_config import TrainConfig

    model_cfg = _model_cfg(args)
    train_cfg = TrainConfig(batch_size=args.batch, seq_len=args.seq_len, dtype=dtype)
    measure = _torch_row if framework == "torch" else _jax_row
    got = measure(args, model_cfg, train_cfg)
    report, gdn = got["report"], model_cfg.gdn
    step_time = report.step_time_s
    model_flops = model_flops_per_step(model_cfg, batch=args.batch, seq_len=args.seq_len).total
    rule_flops = 3 * gdn_rule_flops(batch=args.batch, seq_len=args.seq_len,
                                    num_k_heads=gdn.num_k_heads, num_v_heads=gdn.num_v_heads,
                                    head_k_dim=gdn.head_k_dim, head_v_dim=gdn.head_v_dim,
                                    chunk_size=gdn.chunk_size).total
    peak_flops, peak_source = got["peak"]
    mfu = model_flops / (step_time * peak_flops)
    error = None
    if not all(math.isfinite(x) for x in report.losses):
        error = f"non-finite loss: {report.losses}"
    elif mfu > 1:
        error = f"MFU {mfu:.3f} > 1 is impossible: the step time or the peak is wrong"
    return StepRow(
        framework=framework, dtype=dtype, preset=args.preset, layers=model_cfg.num_layers,
        seq_len=args.seq_len, batch=args.batch, device_name=got["device_name"],
        step_time_s=step_time, step_times_s=list(report.step_times_s),
        tokens_per_s=args.batch * args.seq_len / step_time, model_flops_per_step=model_flops,
        peak_flops_per_s=peak_flops, peak_source=peak_source, mfu=mfu,
        peak_memory_bytes=report.peak_memory_bytes, memory_source=report.memory_source,
        xla_estimate_bytes=report.estimated_memory_bytes, compile_time_s=report.compile_time_s,
        rule_time_s=got["rule_time"], rule_flops_per_s=rule_flops / got["rule_time"],
        rule_share=model_cfg.num_layers * got["rule_time"] / step_time,
        losses=list(report.losses), error=error)


# --------------------------------------------------------------------------- the table (parent)

def _child_argv(args, framework: str, dtype: str) -> list[str]:
    argv = [sys.executable, "-m", "gdn_core.bench", "step", "--row", f"{framework}:{dtype}",
            "--device", args.device, "--preset", args.preset, "--seq-len", str(args.seq_len),
            "--batch", str(args.batch), "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--rule-repeats", str(args.rule_repeats)]
    return argv + (["--layers", str(args.layers)] if args.layers is not None else [])


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def run_row_in_child(args, framework: str, dtype: str, *, timeout_s: float) -> StepRow:
    """Run one row in a fresh Python process; a failure or timeout becomes the row's error."""
    base = dict(framework=framework, dtype=dtype, preset=args.preset,
                layers=_model_cfg(args).num_layers, seq_len=args.seq_len, batch=args.batch)
    if timeout_s <= 0:
        return StepRow(**base, error="not run: --budget-s spent by the rows before it")
    start = time.perf_counter()
    try:
        done = subprocess.run(_child_argv(args, framework, dtype), capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        return StepRow(**base, wall_s=time.perf_counter() - start,
                       error=f"timed out after {timeout_s:.0f} s (--budget-s): "
                             f"{_tail(str(err.stderr or ''), 2)}")
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(ROW_PREFIX)]
    if done.returncode != 0 or not lines:
        return StepRow(**base, wall_s=wall,
                       error=f"exit {done.returncode}: {_tail(done.stderr or done.stdout)}")
    fields = json.loads(lines[-1][len(ROW_PREFIX):])
    return StepRow(**{**fields, "wall_s": wall})


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def _num(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(x / scale, fmt)


COLUMNS = ("framework", "dtype", "model", "seq", "step s", "tokens/s", "MFU", "peak TFLOP/s",
           "mem GiB", "xla est GiB", "rule TFLOP/s", "rule share", "loss first→last",
           "compile s", "wall s")


def _cells(row: StepRow) -> list[str]:
    loss = f"{row.losses[0]:.3f}→{row.losses[-1]:.3f}" if row.losses else "-"
    return [row.framework, row.dtype, f"{row.preset} x{row.layers}L", str(row.seq_len),
            _num(row.step_time_s, ".3f"), _num(row.tokens_per_s, ",.0f"),
            _num(row.mfu, ".1%"), _num(row.peak_flops_per_s, ".4g", 1e12),
            _gib(row.peak_memory_bytes), _gib(row.xla_estimate_bytes),
            _num(row.rule_flops_per_s, ".3g", 1e12), _num(row.rule_share, ".0%"), loss,
            _num(row.compile_time_s or None, ".0f"), _num(row.wall_s, ".0f")]


def format_table(rows: Sequence[StepRow]) -> str:
    """The rows as an aligned text table, then each row's peak and memory sources and errors."""
    cells = [list(COLUMNS)] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    text = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    for row in rows:
        label = f"{row.framework} {row.dtype}"
        if row.ok:
            times = [round(t, 4) for t in row.step_times_s]
            text.append(f"{label}: device {row.device_name!r}; peak {row.peak_source}; memory "
                        f"{row.memory_source}; step times {times}")
        else:
            text.append(f"{label}: FAILED: {row.error}")
    return "\n".join(text)


def format_markdown(rows: Sequence[StepRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    lines += [""] + [f"- {r.framework} {r.dtype}: " + (
        f"device {r.device_name}; peak {r.peak_source}; memory {r.memory_source}" if r.ok
        else f"FAILED: {r.error}") for r in rows]
    return "\n".join(lines) + "\n"


def write_outputs(rows: Sequence[StepRow], out_dir: str) -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "step-table.json", out / "step-table.md"]
    paths[0].write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) + "\n")
    paths[1].write_text(format_markdown(rows))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.row is not None:  # a child: one row, printed as JSON on the marked line
        framework, dtype = args.row.split(":")
        row = run_row(args, framework, dtype)
        print(ROW_PREFIX + json.dumps(dataclasses.asdict(row)), flush=True)
        return 0
    frameworks = _choices(args.frameworks, FRAMEWORKS, "--frameworks")
    dtypes = _choices(args.dtypes, DTYPES, "--dtypes")
    model_cfg = _model_cfg(args)
    print(f"one-chip training step: {args.preset} with {model_cfg.num_layers} layers, "
          f"B={args.batch} T={args.seq_len}, device={args.device}, {args.warmup} warm-up + "
          f"{args.steps} measured steps, budget {args.budget_s:.0f} s", flush=True)
    deadline = time.perf_counter() + args.budget_s
    rows = []
    for dtype in dtypes:
        for framework in frameworks:
            row = run_row_in_child(args, framework, dtype,
                                   timeout_s=deadline - time.perf_counter())
            print(f"  {framework} {dtype}: " + ("ok" if row.ok else f"FAILED: {row.error}")
                  + (f" ({row.wall_s:.0f} s)" if row.wall_s is not None else ""), flush=True)
            rows.append(row)
    print(format_table(rows))
    if args.out:
        for path in write_outputs(rows, args.out):
            print(f"wrote {path}")
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
