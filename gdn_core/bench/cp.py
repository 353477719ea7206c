"""CP benchmark: per mode and chip count, what one chip holds, receives and computes.

    python -m gdn_core.bench cp [--preset qwen3.5-0.8b] [--local-tokens 4096]
                                [--chips 1 2 4 8] [--modes ...] [--time-steps 0]
                                [--layers hybrid [--attn-cps ...] [--no-measure]]

--layers hybrid prints the hybrid decoder's table instead: analytic figures per (mode, attn_cp)
and, unless --no-measure, one GDN and one attention layer timed on D virtual chips (cp_hybrid.py),
then torch's reference and fused attention kernels timed side by side per (attn_cp, D) on D
gloo processes (cp_attention_kernels.py).
Its defaults are small (preset tiny, 256 local tokens, D 1 2 4: about a minute on an idle
2-core host), as every timed layer compiles and runs here; pass --preset etc. (with
--no-measure for full-size shapes, whose timing on virtual CPU chips takes minutes per row).

The measured program is one GDN layer's training step (forward + backward w.r.t. its input and
parameters) with the preset's geometry, the sequence split over D virtual CPU chips inside one
shard_map (run in a fresh process: the chip count is fixed when JAX starts). Per (mode, D):
  memory/chip   XLA memory_analysis of the compiled step: arguments + outputs + temps − aliased
  recv/chip     bytes the busiest chip receives in the CP exchanges (compiled HLO, hlo_comm)
  grad sum      what summing the layer's parameter gradients over D chips adds (ring)
  flops ratio   XLA cost_analysis flops per chip × D ÷ flops of the same step on one chip over
                the whole sequence: the compute CP adds (goal ≤ 1.10 at D = 8)
  mem ratio     memory/chip ÷ the D = 1 figure at the same local shard (goal ≤ 1.02)
  step s        wall time of the step (only with --time-steps N; all virtual chips share this
                host's cores, so it measures total work, not per-chip speed)
Everything but step time comes from compiling, so full-size shapes cost no memory here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

CHIPS = (1, 2, 4, 8)
DEFAULTS = {"gdn_only": {"preset": "qwen3.5-0.8b", "local_tokens": 4096, "chips": list(CHIPS)},
            "hybrid": {"preset": "tiny", "local_tokens": 256, "chips": [1, 2, 4]}}
"""--preset, --local-tokens and --chips when not given, per --layers."""


def build_parser() -> argparse.ArgumentParser:
    from ..cp_modes import ATTN_CP_MODES, CP_MODES

    p = argparse.ArgumentParser(prog="python -m gdn_core.bench cp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", help="default qwen3.5-0.8b (hybrid: tiny)")
    p.add_argument("--local-tokens", type=int, help="tokens per chip, default 4096 (hybrid: 256)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--chips", type=int, nargs="+", help="default 1 2 4 8 (hybrid: 1 2 4)")
    p.add_argument("--modes", nargs="+", default=list(CP_MODES), choices=CP_MODES)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--time-steps", type=int, default=0,
                   help="also run each compiled step this many times and report the median")
    p.add_argument("--layers", choices=("gdn_only", "hybrid"), default="gdn_only",
                   help="gdn_only: one GDN layer compiled per mode (the table above); hybrid: "
                        "the whole hybrid decoder per (mode, attn_cp): analytic, plus one GDN "
                        "and one attention layer timed (cp_hybrid.py)")
    p.add_argument("--attn-cps", nargs="+", default=list(ATTN_CP_MODES), choices=ATTN_CP_MODES,
                   help="attention CP modes of the hybrid (--layers hybrid)")
    p.add_argument("--no-measure", action="store_true",
                   help="--layers hybrid: print the analytic columns only (no layer timing)")
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous",
                   help="--layers hybrid: the sequence layout the layers are timed under")
    p.add_argument("--repeats", type=int, default=5,
                   help="--layers hybrid: timed runs per layer (the median is reported)")
    return p


def _layer_step(cfg, mode: str | None, chips: int, dtype):
    """A jitted fwd+bwd of one layer: (params, x) -> (d params, d x); mode None = one chip."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    from ..jax_gdn.cp.layer import cp_gdn_layer
    from ..jax_gdn.layer import gdn_layer

    def loss(params, x_BTD, layer):
        return jnp.sum(layer(params, x_BTD).astype(jnp.float32) ** 2)

    if mode is None:
        layer = lambda params, x: gdn_layer(params, x, cfg, dtype=dtype)  # noqa: E731
        return jax.jit(jax.grad(lambda p, x: loss(p, x, layer), argnums=(0, 1)))
    mesh = Mesh(np.array(jax.devices()[:chips]), ("cp",))
    layer = lambda params, x: cp_gdn_layer(params, x, cfg, axis="cp", mode=mode,  # noqa: E731
                                           dtype=dtype)

    def shard_grad(params, x_BTD):
        return jax.grad(lambda p, x: loss(p, x, layer), argnums=(0, 1))(params, x_BTD)

    # check_vma=False: parameter gradients stay this chip's contribution (no psum inserted), so
    # the received bytes are the CP exchanges alone; the gradient sum is reported separately.
    return jax.jit(jax.shard_map(shard_grad, mesh=mesh, in_specs=(P(), P(None, "cp")),
                                 out_specs=(P(), P(None, "cp")), check_vma=False))


def _measure(cfg, mode, chips, args, dtype):
    import jax
    import jax.numpy as jnp

    from ..jax_gdn.hlo_comm import received_bytes_per_chip
    from ..jax_gdn.params import init_layer_params
    from ..jax_gdn.train import compiled_peak_bytes

    params = init_layer_params(cfg, jax.random.PRNGKey(0))
    x_shape = (args.batch, args.local_tokens * chips, cfg.hidden_size)
    step = _layer_step(cfg, mode, chips, dtype)
    x_spec = jax.ShapeDtypeStruct(x_shape, jnp.float32)
    compiled = step.lower(params, x_spec).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    row = dict(memory=compiled_peak_bytes(compiled), flops_per_chip=float(cost.get("flops", 0.0)),
               recv=received_bytes_per_chip(compiled, chips)["max_bytes"] if chips > 1 else 0,
               step_s=None)
    if args.time_steps:
        x = jax.random.normal(jax.random.PRNGKey(1), x_shape, jnp.float32)
        jax.block_until_ready(compiled(params, x))
        times = []
        for _ in range(args.time_steps):
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, x))
            times.append(time.perf_counter() - start)
        row["step_s"] = statistics.median(times)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name, value in DEFAULTS[args.layers].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.layers == "hybrid":  # analytic, and the layers timed on virtual chips
        from ..presets import get_preset
        from .cp_hybrid import report

        if not args.no_measure:
            os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before the import below loads JAX
            from ..jax_gdn.virtual_chips import ensure_virtual_chips

            ensure_virtual_chips(max(args.chips), fresh_process="python -m gdn_core.bench cp")
        report(get_preset(args.preset, layers="hybrid"), modes=args.modes,
               attn_cps=args.attn_cps, chips_list=args.chips, local_tokens=args.local_tokens,
               batch=args.batch, dtype=args.dtype, measure=not args.no_measure,
               layout=args.layout, repeats=args.repeats)
        return 0
    # Virtual chips are CPU devices; on a GPU host the compiled CPU programs still give the
    # per-chip memory/flops/comm structure (time it on real chips through the sweep instead).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before the import below loads JAX
    from ..jax_gdn.virtual_chips import ensure_virtual_chips

    ensure_virtual_chips(max(args.chips), fresh_process="python -m gdn_core.bench cp")
    import jax.numpy as jnp

    from ..cp_modes import check_cp_shape
    from ..presets import get_preset

    cfg = get_preset(args.preset).gdn
    dtype = jnp.dtype(args.dtype)
    print(f"preset={args.preset} GDN layer: hidden={cfg.hidden_size} heads={cfg.num_k_heads}/"
          f"{cfg.num_v_heads} Dk={cfg.head_k_dim} Dv={cfg.head_v_dim} chunk={cfg.chunk_size}; "
          f"local shard {args.local_tokens} tokens x batch {args.batch}; dtype {args.dtype}; "
          f"one layer fwd+bwd; figures per chip")
    single = {}  # D -> one-chip run over the same global sequence (flops reference)
    local_ref = None  # one chip holding one local shard (memory reference)
    print(f"{'mode':<11}{'D':>3}{'memory/chip MiB':>17}{'mem ratio':>11}{'recv/chip MiB':>15}"
          f"{'grad sum MiB':>14}{'flops ratio':>13}{'step s':>9}")
    memory = {}  # mode -> {D: bytes}
    for chips in sorted(args.chips):
        for mode in args.modes:
            try:
                check_cp_shape(mode=mode, chips=chips, seq_len=args.local_tokens * chips,
                               num_k_heads=cfg.num_k_heads, num_v_heads=cfg.num_v_heads,
                               conv_kernel_size=cfg.conv_kernel_size)
            except ValueError as err:
                print(f"{mode:<11}{chips:>3}  skipped: {err}")
                continue
            if local_ref is None:
                local_ref = _measure(cfg, None, 1, args, dtype)
            if chips not in single:
                single[chips] = (local_ref if chips == 1 else
                                 _measure(cfg, None, 1, _scaled(args, chips), dtype))
            row = local_ref if chips == 1 else _measure(cfg, mode, chips, args, dtype)
            flops_ratio = row["flops_per_chip"] * chips / single[chips]["flops_per_chip"]
            step = f"{row['step_s']:9.3f}" if row["step_s"] is not None else f"{'-':>9}"
            memory.setdefault(mode, {})[chips] = row["memory"]
            print(f"{mode:<11}{chips:>3}{row['memory'] / 2**20:17.1f}"
                  f"{row['memory'] / local_ref['memory']:11.4f}{row['recv'] / 2**20:15.3f}"
                  f"{_grad_sum_bytes(cfg, chips) / 2**20:14.1f}{flops_ratio:13.4f}{step}")
            sys.stdout.flush()
    print("per-chip memory max/min across D (goal <= 1.02): " + "; ".join(
        f"{mode} {_spread(by_d)} (D>=2: {_spread({d: b for d, b in by_d.items() if d > 1})})"
        for mode, by_d in memory.items()))
    return 0


def _spread(bytes_by_chips: dict[int, int]) -> str:
    values = list(bytes_by_chips.values())
    return f"{max(values) / min(values):.4f}" if values else "-"


def _grad_sum_bytes(cfg, chips: int) -> float:
    """Ring all-reduce of the layer's float32 parameter gradients: 2·(D−1)/D × their bytes."""
    from ..torch_gdn.layer import GatedDeltaNet

    params = sum(p.numel() for p in GatedDeltaNet(cfg).parameters())
    return 2 * (chips - 1) / chips * 4 * params


def _scaled(args, chips):
    """The same arguments with the whole sequence on one chip (no timing: may not fit)."""
    return argparse.Namespace(**{**vars(args), "local_tokens": args.local_tokens * chips,
                                 "time_steps": 0})
