"""The JAX rule's device-check row: the reference XLA rule (jax_gdn.chunk) beside the Pallas chunk
rule (jax_gdn.pallas), forward + backward, one layer's rule at 32K tokens, bf16.

    python -m gdn_core.bench.kernel_pallas --device cuda            # the GPU machine
    python -m gdn_core.bench.kernel_pallas --device cpu --interpret  # toy sizes, interpreted

First a check, untimed: the Pallas rule's output and every input gradient against the XLA
rule's on the same inputs and dtype (relative, Frobenius; bf16 within 2e-2, the reference's
own bf16 tolerance; float32 within 1e-4). Then both timed alternately (median of --repeats
after --warmup untimed runs, which hold the compiles). The goals (issue 39): at least 2× the
XLA rule on an H100, within 1.5× of fla's Triton rule (the kernel part's figure), and on a TPU
at least MaxText's XLA scan. Exit 1 when the check fails; 0 otherwise (a slow kernel is a
figure, not a failure). Interpreted timings measure Pallas's interpreter, never the kernel.
Legend: B batch, T tokens, Hk/Hv key/value heads, K/V head dims.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from .alternating import time_alternating

TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-4}
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gdn_core.bench.kernel_pallas",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "tpu", "cpu"), default="cuda")
    p.add_argument("--interpret", action="store_true",
                   help="run the Pallas rule through Pallas's interpreter (a CPU's only way)")
    p.add_argument("--dtype", choices=tuple(TOLERANCE), default="bfloat16")
    p.add_argument("--seq-len", type=int, default=32768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--num-k-heads", type=int, default=16)
    p.add_argument("--num-v-heads", type=int, default=16)
    p.add_argument("--head-k-dim", type=int, default=128)
    p.add_argument("--head-v-dim", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    return p


def make_arrays(args, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs as a trained layer feeds the rule: keys of a head near one direction (cosine
    0.9), β ∈ U(0.5, 1), log decay log U(0.9, 1); a cotangent `do` for the backward."""
    rng = np.random.default_rng(seed)
    B, T, Hk, Hv, K, V = (args.batch, args.seq_len, args.num_k_heads, args.num_v_heads,
                          args.head_k_dim, args.head_v_dim)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    k = unit(0.9 * unit(rng.standard_normal((Hk, K)))
             + np.sqrt(1 - 0.81) * unit(rng.standard_normal((B, T, Hk, K))))
    arrays = dict(q=rng.standard_normal((B, T, Hk, K)), k=k,
                  v=rng.standard_normal((B, T, Hv, V)),
                  g=np.log(rng.uniform(0.9, 1.0, (B, T, Hv))),
                  beta=rng.uniform(0.5, 1.0, (B, T, Hv)),
                  do=rng.standard_normal((B, T, Hv, V)))
    return {name: a.astype(np.float32) for name, a in arrays.items()}


def rule_runner(rule, arrays, *, dtype, device, **kwargs):
    """A callable running the rule's forward + backward once (synchronised): (o, grads)."""
    import jax
    import jax.numpy as jnp

    target = jax.devices("gpu" if device == "cuda" else device)[0]
    inputs = [jax.device_put(jnp.asarray(arrays[n], dtype), target)
              for n in ("q", "k", "v", "g", "beta")]
    do = jax.device_put(jnp.asarray(arrays["do"], dtype), target)

    @jax.jit
    def fwd_bwd(q, k, v, g, beta, do):
        o, vjp = jax.vjp(lambda *x: rule(*x, use_qk_l2norm=True, **kwargs)[0], q, k, v, g, beta)
        return o, vjp(do)

    def run():
        return jax.block_until_ready(fwd_bwd(*inputs, do))

    return run


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cpu" and not args.interpret:
        print("the Pallas rule has no CPU kernel: pass --interpret (Pallas's interpreter)")
        return 2
    from ..jax_gdn.chunk import chunk_gated_delta_rule
    from ..jax_gdn.pallas.chunk_rule import KERNEL_NAME, chunk_gated_delta_rule_pallas
    from ..testing import rel_err

    platform = {"cuda": "gpu", "tpu": "tpu", "cpu": None}[args.device]
    label = f"{KERNEL_NAME} ({'interpreted' if args.interpret else platform})"
    print(f"JAX GDN rule, forward + backward: B={args.batch} T={args.seq_len} "
          f"Hk={args.num_k_heads} Hv={args.num_v_heads} K={args.head_k_dim} "
          f"V={args.head_v_dim} chunk {args.chunk_size}, {args.dtype}, device {args.device}")
    arrays = make_arrays(args)
    common = dict(dtype=args.dtype, device=args.device, chunk_size=args.chunk_size)
    runners = {
        "xla_reference": rule_runner(chunk_gated_delta_rule, arrays, **common),
        "pallas": rule_runner(chunk_gated_delta_rule_pallas, arrays, platform=platform,
                              interpret=args.interpret, **common),
    }
    start = time.perf_counter()
    want_o, want_grads = runners["xla_reference"]()
    got_o, got_grads = runners["pallas"]()
    print(f"first calls (compiles included): {time.perf_counter() - start:.1f} s")
    errors = {name: rel_err(w, g) for name, w, g in zip(
        NAMES, (want_o, *want_grads), (got_o, *got_grads))}
    tolerance = TOLERANCE[args.dtype]
    print(f"check {label} vs xla_reference ({args.dtype}, tolerance {tolerance:.0e}): "
          + ", ".join(f"{n} {e:.2e}" for n, e in errors.items()))
    if max(errors.values()) > tolerance:
        print("FAILED: the Pallas rule and the XLA rule disagree beyond the tolerance")
        return 1
    times = time_alternating(runners, warmup=args.warmup, repeats=args.repeats)
    xla = statistics.median(times["xla_reference"])
    tokens = args.batch * args.seq_len
    print(f"forward + backward ({args.repeats} timed runs each, alternating):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<14} median {med:.4f} s, {tokens / med:,.0f} tokens/s, "
              f"{xla / med:.2f}x xla_reference")
    if args.interpret:
        print("interpreted: these times measure Pallas's interpreter, not the kernel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
