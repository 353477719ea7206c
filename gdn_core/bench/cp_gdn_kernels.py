"""torch's GDN rule under the all_gather CP mode, three ways side by side in one run:

    python -m gdn_core.bench cp-gdn [--device cpu|cuda] [--chips 2] [--local-tokens 64]
                                    [--heads 1 2] [--head-dims 32 32] [--chunk 16]
                                    [--dtype float32] [--layout contiguous] [--repeats 3]

    reference      this package's CP rule (chunk pairs folded, all-gathered, replayed)
    fla composed   fla-core's kernel composed with our all_gather exchange (kernels="fused":
                   torch_gdn.cp.kernel_rule: a summary call at width K+V, then the replay)
    fla cp_context fla-core's own CP (fla.ops.cp's cp_context, gdn_kernel="fla_cp_context")

On D ranks spawned on this host: gloo on a CPU, where fla runs only under Triton's interpreter
(this sets GDN_SWEEP_INTERPRET_KERNELS=1: a correctness run, its times mean nothing), or NCCL
with one GPU per rank (--device cuda: D GPUs on this host). One rule call, forward and
backward, on the same inputs per rank (realistic keys: a shared direction per head); the three
are alternated run by run; a run's time is the slowest rank's; the median over --repeats runs
after one warm-up of each (fla's autotune there, never in a timed run). The outputs and input
gradients of the two fla paths are compared with the reference's first (relative error); a
path that cannot serve the point prints its reason (KernelUnavailable), never the other's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

from .ranks import run_on_ranks

PATHS = ("reference", "fla composed", "fla cp_context")
GDN_KERNEL_OF = {"reference": None, "fla composed": "fla", "fla cp_context": "fla_cp_context"}
"""Path → gdn_kernels.gdn_rule_kernel name (None: this package's CP rule, no kernel)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gdn_core.bench cp-gdn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--chips", type=int, default=2, help="ranks (D)")
    p.add_argument("--local-tokens", type=int, default=64, help="tokens per rank")
    p.add_argument("--heads", type=int, nargs=2, default=(1, 2), metavar=("HK", "HV"))
    p.add_argument("--head-dims", type=int, nargs=2, default=(32, 32), metavar=("DK", "DV"))
    p.add_argument("--chunk", type=int, default=16, choices=(16, 32, 64))
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    p.add_argument("--repeats", type=int, default=3)
    return p


def _inputs(rank: int, spec: dict):
    """This rank's q, k, v, g, beta and output weights: keys of a head near one direction
    (cosine ~0.9), beta in (0.5, 1), weak decay (realistic inputs for the rule)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    t, (Hk, Hv), (K, V) = spec["local_tokens"], spec["heads"], spec["head_dims"]
    direction = torch.randn(1, 1, Hk, K, generator=torch.Generator().manual_seed(7))
    k = 0.9 * direction / direction.norm(dim=-1, keepdim=True) + 0.44 * torch.randn(
        1, t, Hk, K, generator=gen) / K ** 0.5
    q, v = torch.randn(1, t, Hk, K, generator=gen), torch.randn(1, t, Hv, V, generator=gen)
    g = torch.log(torch.rand(1, t, Hv, generator=gen) * 0.05 + 0.95)
    beta = torch.rand(1, t, Hv, generator=gen) * 0.5 + 0.5
    return (q, k, v, g, beta), torch.randn(1, t, Hv, V, generator=gen)


def _time_paths(rank: int, world: int, spec: dict) -> dict:
    """{path: [seconds per run]} or {path: "unavailable: reason"}, and {path + " err": e}."""
    import torch
    import torch.distributed as dist

    from ..kernels import KernelUnavailable
    from ..testing import rel_err
    from ..torch_gdn.cp import chunk_gated_delta_rule_cp
    from ..torch_gdn.gdn_kernels import gdn_rule_kernel

    device = torch.device("cuda", rank) if spec["device"] == "cuda" else torch.device("cpu")
    dtype = getattr(torch, spec["dtype"])
    arrays, w_o = _inputs(rank, spec)
    arrays = [x.to(device, dtype if i < 3 else torch.float32) for i, x in enumerate(arrays)]
    w_o = w_o.to(device)

    def run(path):
        name = GDN_KERNEL_OF[path]
        kernel = None if name is None else gdn_rule_kernel(name, chunk_size=spec["chunk"])
        leaves = [x.detach().requires_grad_() for x in arrays]
        o, _ = chunk_gated_delta_rule_cp(*leaves, group=None, mode="all_gather",
                                         layout=spec["layout"], use_qk_l2norm=True,
                                         chunk_size=spec["chunk"], kernel=kernel)
        (o.float() * w_o).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return [o.float()] + [x.grad.float() for x in leaves]

    out, results = {}, {}
    for path in PATHS:  # the warm-up: autotune and first calls, and each path's answer
        try:
            results[path] = run(path)
        except KernelUnavailable as err:  # raised alike on every rank, before any exchange
            out[path] = f"unavailable: {err}"
    for path in results:
        if path != "reference":
            out[path + " err"] = max(rel_err(a, b) for a, b in
                                     zip(results["reference"], results[path]))
    times = {path: [] for path in results}
    for _ in range(spec["repeats"]):
        for path in results:
            dist.barrier()
            start = time.perf_counter()
            run(path)
            slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64,
                                   device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[path].append(slowest.item())
    return out | times


def report(spec: dict, *, out=print, measure=run_on_ranks) -> dict:
    """Print the module docstring's table; returns rank 0's figures."""
    backend = "nccl" if spec["device"] == "cuda" else "gloo"
    figures = measure(_time_paths, spec, chips=spec["chips"], backend=backend)
    where = ("Triton's interpreter on this CPU: times are NOT speeds"
             if spec["device"] == "cpu" else f"{spec['chips']} GPUs, NCCL")
    out(f"TORCH GDN RULE UNDER all_gather, D={spec['chips']} ({where}); q/k [1, "
        f"{spec['local_tokens']}, {spec['heads'][0]}, {spec['head_dims'][0]}] per rank, "
        f"{spec['dtype']}, layout {spec['layout']}, chunk {spec['chunk']}; one rule fwd+bwd, "
        f"slowest rank, median of {spec['repeats']} runs, paths alternated")
    out(f"  {'path':<16}{'ms':>10}{'vs reference':>14}{'max rel err':>13}")
    ref_ms = None
    for path in PATHS:
        if isinstance(figures.get(path), str):
            out(f"  {path:<16}{figures[path]}")
            continue
        ms = 1e3 * statistics.median(figures[path])
        ref_ms = ms if path == "reference" else ref_ms
        ratio = f"{ms / ref_ms:.2f}x" if ref_ms else "-"
        err = figures.get(path + " err")
        out(f"  {path:<16}{ms:10.2f}{ratio:>14}{'-' if err is None else f'{err:.1e}':>13}")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cpu":  # fla runs here only interpreted; the ranks inherit the switch
        os.environ["GDN_SWEEP_INTERPRET_KERNELS"] = "1"
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        import torch

        if torch.cuda.device_count() < args.chips:
            print(f"--device cuda --chips {args.chips}: this host has "
                  f"{torch.cuda.device_count()} GPU(s); NCCL takes one GPU per rank")
            return 2
    spec = dict(vars(args), heads=tuple(args.heads), head_dims=tuple(args.head_dims))
    figures = report(spec)
    # Interpreted fla computes in float32 like ours; on a GPU its dots are TF32 / bf16.
    tolerance = 1e-4 if args.device == "cpu" else 5e-2
    bad = [p for p in PATHS[1:] if (figures.get(p + " err") or 0) > tolerance]
    if bad:
        print(f"FAILED: {', '.join(bad)} differ from the reference beyond {tolerance:.0e}")
    return 1 if bad else 0


__all__ = ["PATHS", "main", "report"]
