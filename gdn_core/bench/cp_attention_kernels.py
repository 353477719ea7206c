"""`bench cp --layers hybrid`'s torch attention table: the reference and the fused attention
kernel (kernels: reference → tiles, fused → sdpa; torch_gdn.attention_kernels) side by side at
the hybrid table's points, measured in one run.

Per (attn_cp, D): one attention_cp forward + backward of the hybrid's attention geometry
(q [B, t, H, E], k, v [B, t, G, E] per rank, in --dtype, --layout) on D gloo processes spawned on
this host (each with cores/D torch threads, at least one), the two kernels alternated run by run
on the same ranks and inputs; a run's time is the slowest rank's, the median over `repeats` runs
after one warm-up of each is printed:
  ms reference   ms fused   ref/fused (> 1: the fused kernel is faster)
D = 1 is one chip (no collective; attn_cp unused). The columns time the attention core only,
not the layer's projections, which no kernel changes. A kernel that cannot serve the point is
printed with its reason (kernels.KernelUnavailable), never replaced by the other.
"""

from __future__ import annotations

import os
import statistics
import time

from .ranks import run_on_ranks

KERNELS = ("reference", "fused")


def _time_cases(rank: int, world: int, spec: dict) -> dict:
    """{(attn_cp, kernels): [seconds per run]} (slowest rank's) or {attn_cp: skip reason}."""
    import torch
    import torch.distributed as dist

    from ..torch_gdn.attention_kernels import ATTENTION_KERNEL_FOR
    from ..cp_modes import check_attention_cp_shape
    from ..torch_gdn.cp.attention import attention_cp

    B, t, H, G, E = (spec[n] for n in ("batch", "local_tokens", "heads", "kv_heads", "head_dim"))
    dtype = getattr(torch, spec["dtype"])
    gen = torch.Generator().manual_seed(rank)
    q, k, v, do = (torch.randn(B, t, n, E, generator=gen).to(dtype) for n in (H, G, G, H))
    out = {}
    for attn_cp in spec["attn_cps"]:
        try:
            check_attention_cp_shape(attn_cp=attn_cp, chips=world, num_heads=H,
                                     num_kv_heads=G, seq_len=t * world, layout=spec["layout"])
        except ValueError as err:
            out[attn_cp] = str(err)
            continue
        runs = {kernels: [] for kernels in spec["kernels"]}
        for repeat in range(spec["repeats"] + 1):  # the first run of each kernel warms up
            for kernels in spec["kernels"]:
                x = [a.detach().requires_grad_() for a in (q, k, v)]
                dist.barrier()
                start = time.perf_counter()
                o = attention_cp(*x, group=None, mode=attn_cp, layout=spec["layout"],
                                 kernel=ATTENTION_KERNEL_FOR[kernels])
                o.backward(do)
                slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if repeat:
                    runs[kernels].append(slowest.item())
        out.update({(attn_cp, kernels): times for kernels, times in runs.items()})
    return out


def measure_attention_kernels(spec: dict, *, chips: int, timeout_s: float = 600.0) -> dict:
    """Spawn `chips` gloo ranks on this host and time every attn_cp of spec under every
    kernels value of spec; returns rank 0's view ({(attn_cp, kernels): seconds per run})."""
    return run_on_ranks(_time_cases, spec, chips=chips, timeout_s=timeout_s)


def kernel_names(*, dtype: str, head_dim: int) -> dict[str, str]:
    """{kernels: the resolved kernel's name, or "unavailable: <reason>"} on this host's CPU."""
    from ..kernels import KernelUnavailable
    from ..torch_gdn.attention_kernels import resolve_torch_attention_kernel

    names = {}
    for kernels in KERNELS:
        try:
            names[kernels] = resolve_torch_attention_kernel(kernels, device="cpu", dtype=dtype,
                                                            head_dim=head_dim)
        except KernelUnavailable as err:
            names[kernels] = f"unavailable: {err}"
    return names


def format_row(attn_cp: str, chips: int, times: dict) -> str:
    """One table row: median ms of each kernels value, and reference ÷ fused."""
    if isinstance(times.get(attn_cp), str):
        return f"{'torch':<7}{attn_cp:<14}{chips:>3}  skipped: {times[attn_cp]}"
    ms = {kernels: 1e3 * statistics.median(times[(attn_cp, kernels)])
          if (attn_cp, kernels) in times else float("nan") for kernels in KERNELS}
    shown = attn_cp if chips > 1 else "-"
    return (f"{'torch':<7}{shown:<14}{chips:>3}{ms['reference']:15.2f}{ms['fused']:11.2f}"
            f"{ms['reference'] / ms['fused']:11.2f}")


def report(model_cfg, *, attn_cps, chips_list, local_tokens: int, batch: int, dtype: str,
           layout: str, repeats: int, out=print, measure=measure_attention_kernels) -> None:
    """Print the module docstring's table for every (attn_cp, D); `measure` is
    measure_attention_kernels (a stand-in in tests)."""
    a = model_cfg.attention
    names = kernel_names(dtype=dtype, head_dim=a.head_dim)
    kernels = [k for k in KERNELS if not names[k].startswith("unavailable")]
    out(f"TORCH ATTENTION KERNELS (measured: D gloo processes on this host's "
        f"{len(os.sched_getaffinity(0))} cores, cores/D threads each): one attention_cp "
        f"fwd+bwd, q [{batch}, {local_tokens}, {a.num_heads}, {a.head_dim}] and k, v "
        f"[{batch}, {local_tokens}, {a.num_kv_heads}, {a.head_dim}] per rank, {dtype}, layout "
        f"{layout}; slowest rank, median of {repeats} runs, kernels alternated")
    out("  " + "; ".join(f"{k}: {names[k]}" for k in KERNELS))
    out(f"{'':<7}{'attn_cp':<14}{'D':>3}{'ms reference':>15}{'ms fused':>11}{'ref/fused':>11}")
    for chips in sorted(chips_list):
        spec = {"batch": batch, "local_tokens": local_tokens, "heads": a.num_heads,
                "kv_heads": a.num_kv_heads, "head_dim": a.head_dim, "dtype": dtype,
                "layout": layout, "repeats": repeats, "kernels": kernels,
                "attn_cps": list(attn_cps) if chips > 1 else ["ring"]}
        times = measure(spec, chips=chips)
        for attn_cp in spec["attn_cps"]:
            out(format_row(attn_cp, chips, times))
