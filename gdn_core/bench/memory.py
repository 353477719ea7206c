"""Memory benchmark: per-chip bytes of the JAX CP training step for each (param_sharding, remat).

    python -m gdn_core.bench memory [--preset qwen3.5-9b] [--local-tokens 32768] [--chips 8]
                                    [--dtype bfloat16] [--mode p2p] [--compile-depths 4 32]

Compile-only (nothing is allocated): the full-depth step of gdn_core.jax_gdn.cp.step —
forward, backward, gradient reduction, AdamW — over D virtual CPU chips in this fresh process,
the sequence split over them and the weights laid out by each param_sharding. Per row:
  args / temps   XLA memory_analysis per chip: arguments (weights, AdamW state, tokens) and
                 temporaries (activations, gathered weights, gradients)
  peak           compiled_peak_bytes: arguments + outputs + temporaries − aliased (donated)
  predicted      gdn_core.memory.step.predict_step_memory of the same step (analytic, no
                 compile): the figure admission, the planner and verify use
  headroom       usable memory of the chip minus peak, for an H200 (139 GiB as the runtime
                 reports it), a v5p (95 GiB) and an H100 (80 GiB); "-" where it does not fit
Then the compile time and HLO size of a shallow and a deep step (layers under lax.scan: both
should stay flat in depth). XLA:CPU has no bf16 matmul units and may widen some bf16 buffers,
so bf16 rows are, if anything, an overestimate of a GPU/TPU's buffers.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Sequence

from ..datasheets import GIB, hbm_bytes_per_chip

USABLE_BYTES = {"H200": 139 * GIB, "v5p": hbm_bytes_per_chip("v5p"),
                "H100": hbm_bytes_per_chip("h100")}
"""Usable memory per chip: the H200 as its runtime reports it; v5p and H100 from
gdn_core.datasheets.hbm_bytes_per_chip (vendor figures)."""


def build_parser() -> argparse.ArgumentParser:
    from ..cp_modes import CP_MODES
    from ..train_config import PARAM_SHARDINGS, REMATS

    p = argparse.ArgumentParser(prog="python -m gdn_core.bench memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3.5-9b")
    p.add_argument("--local-tokens", type=int, default=32768, help="tokens per chip")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--chips", type=int, default=8)
    p.add_argument("--layers", type=int, default=None, help="depth (default: the preset's)")
    p.add_argument("--dtypes", nargs="+", choices=("bfloat16", "float32"), default=["bfloat16"],
                   help="compute dtypes of the table's rows (bf16: the realistic setting)")
    p.add_argument("--mode", choices=CP_MODES, default="p2p")
    p.add_argument("--shardings", nargs="+", choices=PARAM_SHARDINGS,
                   default=list(PARAM_SHARDINGS))
    p.add_argument("--remats", nargs="+", choices=REMATS, default=list(REMATS))
    p.add_argument("--compile-depths", type=int, nargs="*", default=[4, 32],
                   help="layer counts whose compile time is measured (fsdp, remat full)")
    return p


def compile_step(model_cfg, train_cfg, *, chips: int, mode: str):
    """(compiled step, lower+compile seconds) of the CP step over the first `chips` chips.

    JAX's in-process caches are cleared first, so the seconds are a cold compile.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from ..cp_modes import CPSettings
    from ..jax_gdn.cp.step import cp_step_shapes, make_cp_train_step
    from ..jax_gdn.cp.train import FAST

    jax.clear_caches()
    mesh = Mesh(np.array(jax.devices()[:chips]), ("cp",))
    start = time.perf_counter()
    shapes = cp_step_shapes(model_cfg, train_cfg, mesh=mesh, axis="cp")
    # FAST skips LLVM optimisation only: buffer assignment (the memory figures) is unchanged.
    compiled = make_cp_train_step(model_cfg, train_cfg, mesh=mesh, axis="cp",
                                  cp=CPSettings(mode=mode, chips=chips)
                                  ).lower(*shapes).compile(FAST)
    return compiled, time.perf_counter() - start


def _headroom(peak: int) -> str:
    return "".join(f"{(usable - peak) / GIB:>9.1f}" if peak <= usable else f"{'-':>9}"
                   for usable in USABLE_BYTES.values())


def _memory_table(model_cfg, args) -> None:
    from ..jax_gdn.train import compiled_peak_bytes
    from ..memory.step import predict_step_memory
    from ..train_config import TrainConfig

    print(f"{'sharding':<11}{'remat':<6}{'dtype':<10}{'args GiB':>9}{'temps GiB':>10}"
          f"{'peak GiB':>9}{'predicted':>10}   headroom GiB: "
          + "".join(f"{name:>9}" for name in USABLE_BYTES) + f"{'compile s':>11}")
    for dtype, sharding, remat in itertools.product(args.dtypes, args.shardings, args.remats):
        train_cfg = TrainConfig(batch_size=args.batch, seq_len=args.local_tokens * args.chips,
                                dtype=dtype, param_sharding=sharding, remat=remat)
        compiled, seconds = compile_step(model_cfg, train_cfg, chips=args.chips,
                                         mode=args.mode)
        stats, peak = compiled.memory_analysis(), compiled_peak_bytes(compiled)
        predicted = predict_step_memory(model_cfg.stand_in, train_cfg, mode=args.mode,
                                        chips=args.chips, framework="jax").total
        print(f"{sharding:<11}{remat:<6}{dtype:<10}"
              f"{stats.argument_size_in_bytes / GIB:9.2f}{stats.temp_size_in_bytes / GIB:10.2f}"
              f"{peak / GIB:9.2f}{predicted / GIB:10.2f}{'':15}{_headroom(peak)}{seconds:11.1f}",
              flush=True)


def _compile_times(model_cfg, args) -> None:
    from ..train_config import TrainConfig

    train_cfg = TrainConfig(batch_size=args.batch, seq_len=args.local_tokens * args.chips,
                            dtype=args.dtypes[0], param_sharding="fsdp", remat="full")
    for layers in args.compile_depths:
        cfg = dataclasses.replace(model_cfg, num_layers=layers)
        compiled, seconds = compile_step(cfg, train_cfg, chips=args.chips, mode=args.mode)
        print(f"cold compile (lower + XLA, fsdp, remat full, {args.dtypes[0]}) of a "
              f"{layers:>3}-layer step: "
              f"{seconds:6.1f} s, optimised HLO {len(compiled.as_text()) / 1e6:.2f} MB of text",
              flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before the import below loads JAX
    from ..jax_gdn.virtual_chips import ensure_virtual_chips

    ensure_virtual_chips(args.chips, fresh_process="python -m gdn_core.bench memory")
    import jax

    from ..jax_gdn.cp.param_sharding import replicated_leaves
    from ..jax_gdn.params import init_model_params
    from ..presets import get_preset

    model_cfg = get_preset(args.preset, num_layers=args.layers)
    params = jax.eval_shape(lambda: init_model_params(model_cfg, jax.random.PRNGKey(0)))
    count = sum(x.size for x in jax.tree.leaves(params))
    whole = replicated_leaves(params, args.chips)
    print(f"preset={args.preset}: {model_cfg.num_layers} layers, {count / 1e9:.2f}B parameters "
          f"(float32 masters + AdamW: {16 * count / GIB:.1f} GiB unsharded); {args.chips} chips "
          f"x {args.local_tokens} local tokens x batch {args.batch}; mode {args.mode}; "
          f"XLA per-chip figures, compile only")
    print(f"leaves kept whole under zero1/fsdp (no dim divisible by {args.chips}): "
          f"{', '.join(whole) if whole else 'none'}")
    sys.stdout.flush()
    _memory_table(model_cfg, args)
    _compile_times(model_cfg, args)
    return 0
