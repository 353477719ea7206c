"""The `gdn-sweep` command line.

    gdn-sweep train --preset tiny --framework torch   train on one chip, print the metrics
    gdn-sweep bench kernel|cp [options]               benchmarks (python -m gdn_core.bench)
"""

from __future__ import annotations

import argparse
import sys

FRAMEWORKS = ("torch", "jax")


def _train(args: argparse.Namespace) -> int:
    from gdn_core import flops, hardware
    from gdn_core.presets import get_preset
    from gdn_core.train_config import TrainConfig

    model_cfg = get_preset(args.preset, num_layers=args.num_layers, vocab_size=args.vocab_size)
    train_cfg = TrainConfig(batch_size=args.batch_size, seq_len=args.seq_len, dtype=args.dtype,
                            learning_rate=args.learning_rate, seed=args.seed)
    if args.framework == "torch":
        from gdn_core.torch_gdn.train import run_training
    else:
        from gdn_core.jax_gdn.train import run_training
    report = run_training(model_cfg, train_cfg, steps=args.steps, warmup_steps=args.warmup_steps)
    peak = hardware.calibrate_cpu_peak_flops()
    model_flops = flops.model_flops_per_step(model_cfg, batch=args.batch_size,
                                             seq_len=args.seq_len).total
    step_time = report.step_time_s
    print(f"framework={args.framework} preset={model_cfg.name} layers={model_cfg.num_layers} "
          f"batch={args.batch_size} seq_len={args.seq_len} dtype={args.dtype} chips=1")
    print(f"loss: first={report.losses[0]:.4f} last={report.losses[-1]:.4f}")
    print(f"step_time_s={step_time:.4f}  tokens_per_s_per_chip="
          f"{flops.tokens_per_s_per_chip(args.batch_size, args.seq_len, step_time, 1):.1f}")
    print(f"model_flops_per_step={model_flops:.4g}  mfu="
          f"{flops.mfu(model_flops, step_time, 1, peak.flops_per_s):.4f}  "
          f"(peak {peak.flops_per_s:.3g} FLOP/s from {peak.source})")
    print(f"peak_memory_bytes_per_chip={report.peak_memory_bytes} ({report.memory_source})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a preset on one chip and print its metrics")
    train.add_argument("--preset", default="tiny")
    train.add_argument("--framework", choices=FRAMEWORKS, default="torch")
    train.add_argument("--num-layers", type=int, default=None)
    train.add_argument("--vocab-size", type=int, default=None)
    train.add_argument("--batch-size", type=int, default=1)
    train.add_argument("--seq-len", type=int, default=512)
    train.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    train.add_argument("--learning-rate", type=float, default=3e-3)
    train.add_argument("--steps", type=int, default=30)
    train.add_argument("--warmup-steps", type=int, default=2)
    train.add_argument("--seed", type=int, default=0)
    train.set_defaults(run=_train)
    bench = sub.add_parser("bench", help="benchmarks: kernel, cp (see python -m gdn_core.bench)",
                           add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda args: _bench(args.bench_args))
    return parser


def _bench(argv: list[str]) -> int:
    from gdn_core.bench import main as bench_main

    return bench_main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
