"""Kernel benchmark: forward + backward of the chunked rule, ours (torch, JAX) vs transformers'.

    python -m gdn_core.bench kernel [--seq-len 8192] [--batch 1] [--repeats 5]
                                    [--device cpu|cuda] [--dtype float32|bfloat16|float16]
                                    [--inverse-blocks 256] [--no-old-inverse]

The three implementations get the same inputs (q, k, v, g, beta; l2norm on; no initial state)
and the same output cotangent. Before timing, each runs once in float32 and our outputs and
gradients are compared with transformers' `torch_chunk_gated_delta_rule`; the benchmark stops
if one of our outputs is off by more than 1e-4 (relative; gradients 1e-3), so it never times
a wrong kernel.
Timed runs alternate between implementations (ABCABC…) after warm-up; medians are reported.

Accuracy on keys that share a direction (cosine 0.95 to a head direction, β ∈ U(0.5, 1),
g = log U(0.95, 1); gdn_core.bench.kernel_numerics) is each implementation's output error,
in the timed dtype, against the float64 token-by-token recurrence; a column of the table.
`jax_old_inv` is our JAX rule traced with the product-form inverse it had before
((I − L)(I + L²)…, exact only for small L): timed beside it to show the change, never checked
(it fails on such keys), and the inverse alone is compared after the table (256 blocks of 64).

Achieved FLOP/s uses gdn_core.flops.model.gdn_rule_flops × 3 (forward + backward) for every
implementation: the useful work of the problem, not what each implementation executes
(transformers' solve and our JAX inverse, built explicitly, do more). Fractions are of float32
GEMM peaks (the dtype all three compute in) measured on the same device: once up front, and by a
GEMM probe timed inside the same alternation (on a shared host it sees the same contention).
On CUDA, a bf16 GEMM and the datasheet peaks of a known GPU (bf16 dense, FP32) are added.

GPU anchor: on CUDA, when flash-linear-attention is importable (`fla-core`; scripts/device-check.sh
puts the wheel under scripts/wheels/ on PYTHONPATH), its Triton `chunk_gated_delta_rule`
(fla.ops.gated_delta_rule: [B, T, H, K] layout, GVA for Hv > Hk, scale Dk^-½,
use_qk_l2norm_in_kernel=True, no initial state) is timed beside ours on the same inputs, in
the timed dtype. It is not held to the float32 check against transformers (its float32 kernels
use TF32 dots); instead its output and gradients must match our torch rule in float32 on the
same (rounded) inputs within FLA_OUTPUT_TOLERANCE / FLA_GRAD_TOLERANCE, or the benchmark fails.
Without it the benchmark prints "fla: not installed" (or why it cannot run) and goes on.
Where fla refuses its training backward (fla-core 0.6.0 on Hopper with 3.4.0 <= Triton < 3.7.1
and no tilelang: gdn_core.kernels.fla_gated_backward_problem, or fla's own RuntimeError), its
forward alone is checked and timed beside our torch rule's forward, the output saying that
the backward was not run and why; the fwd+bwd table then has no fla row.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..calibration import CALIBRATION_GEMM_SIZE, measure_gemm_flops_per_s
from ..datasheets import peak_flops_per_chip, peak_source
from ..device_names import accelerator_type_from_device_name
from ..flops.model import gdn_rule_flops
from ..testing import rel_err
from .kernel_fla import fla_backward_refusal, is_fla_backward_refusal, time_fla_forward_only
from .alternating import time_alternating
from .kernel_runners import (FLA_OUTPUT_TOLERANCE, TORCH_DTYPES,
                             torch_rule_runner)
from .kernel_numerics import (COSINE, compare_inverses, correlated_inputs, float64_output,
                              print_inverse_comparison, product_form_inverse_in_jax_rule)

OUTPUT_TOLERANCE = 1e-4
"""Largest relative (Frobenius) error of our outputs vs transformers' that may be timed."""
GRAD_TOLERANCE = 1e-3
"""Largest relative error of any of our input gradients vs transformers' that may be timed."""
FLA_GRAD_TOLERANCE = {"float32": 2e-2, "bfloat16": 5e-2, "float16": 3e-2}
"""Largest relative error of any of fla's input gradients vs our float32 torch rule."""
IMPLS = ("ours_torch", "ours_jax", "transformers", "fla", "jax_old_inv")
UNCHECKED = ("jax_old_inv", "fla")
"""Not held to the float32 check against transformers: the replaced JAX inverse (timed for
comparison only, wrong on keys that share a direction) and fla (checked against ours, above)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gdn_core.bench kernel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--num-k-heads", type=int, default=2)
    p.add_argument("--num-v-heads", type=int, default=4)
    p.add_argument("--head-k-dim", type=int, default=128)
    p.add_argument("--head-v-dim", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per implementation")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per implementation")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inverse-blocks", type=int, default=256,
                   help="blocks of 64 in the JAX inverse comparison (old vs new); 0: skip it")
    p.add_argument("--old-inverse", action=argparse.BooleanOptionalAction, default=True,
                   help="time jax_old_inv (the replaced product-form inverse) beside ours; "
                        "--no-old-inverse saves its JAX compiles")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: torch's choice); JAX/XLA is not affected")
    return p


def make_inputs(*, batch, seq_len, num_k_heads, num_v_heads, head_k_dim, head_v_dim,
                seed=0) -> dict[str, np.ndarray]:
    """q, k, v standard normal; g = log U(0.8, 1) ≤ 0; beta U(0, 1); cotangent do (float32)."""
    rng = np.random.default_rng(seed)
    B, T = batch, seq_len
    arrays = dict(
        q=rng.standard_normal((B, T, num_k_heads, head_k_dim)),
        k=rng.standard_normal((B, T, num_k_heads, head_k_dim)),
        v=rng.standard_normal((B, T, num_v_heads, head_v_dim)),
        g=np.log(rng.uniform(0.8, 1.0, (B, T, num_v_heads))),
        beta=rng.uniform(0.0, 1.0, (B, T, num_v_heads)),
        do=rng.standard_normal((B, T, num_v_heads, head_v_dim)),
    )
    return {name: a.astype(np.float32) for name, a in arrays.items()}


def _load_transformers_rule():
    try:
        from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule
    except ImportError as err:
        raise SystemExit(
            "the kernel benchmark compares against transformers' torch_chunk_gated_delta_rule "
            "(transformers.models.qwen3_5.modeling_qwen3_5), which could not be imported "
            f"({err}); install transformers>=5 (pip install -e '.[test]')") from err
    return torch_chunk_gated_delta_rule


_COMPILED_JAX_RULES: dict[tuple, object] = {}
"""Compiled fwd+bwd of the JAX rule by (device, dtype, chunk, inverse, shapes): inputs of the
same shapes (the correlated-key run, the step benchmark) reuse one compile."""


def jax_rule_runner(arrays, *, device, dtype, chunk_size, product_form_inverse=False):
    """jit(value_and_grad) over all five inputs; None (with a reason) if JAX lacks the device.

    product_form_inverse: compile the rule with the replaced inverse (for timing only).
    """
    import jax
    import jax.numpy as jnp

    from ..jax_gdn.chunk import chunk_gated_delta_rule

    platform = "gpu" if device == "cuda" else "cpu"
    try:
        jax_device = jax.devices(platform)[0]
    except RuntimeError:
        return None, f"JAX has no {platform} device here"
    jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[dtype]
    inputs = [jax.device_put(jnp.asarray(arrays[n], dtype=jdtype), jax_device)
              for n in ("q", "k", "v", "g", "beta")]
    do = jax.device_put(jnp.asarray(arrays["do"]), jax_device)

    def loss(q, k, v, g, beta, do):
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True, chunk_size=chunk_size)
        return jnp.sum(o.astype(jnp.float32) * do), o

    key = (str(jax_device), dtype, chunk_size, product_form_inverse,
           tuple(x.shape for x in inputs))
    if key not in _COMPILED_JAX_RULES:
        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))
        with (product_form_inverse_in_jax_rule() if product_form_inverse
              else contextlib.nullcontext()):
            _COMPILED_JAX_RULES[key] = step.lower(*inputs, do).compile()
    step = _COMPILED_JAX_RULES[key]

    def run():
        (_, o), grads = jax.block_until_ready(step(*inputs, do))
        return o, list(grads)

    return run, str(jax_device)


def load_fla_rule(device: str) -> tuple[Callable | None, str]:
    """(fla's chunk_gated_delta_rule, its version) or (None, why it cannot run here)."""
    if device != "cuda":
        return None, "fla: needs --device cuda (Triton kernels)"
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.split(".")[0] == "fla":
            return None, "fla: not installed"
        return None, f"fla: not importable ({err})"
    except Exception as err:  # noqa: BLE001 - e.g. a Triton too old for this fla
        return None, f"fla: not importable ({type(err).__name__}: {err})"
    return chunk_gated_delta_rule, f"fla {getattr(fla, '__version__', '?')} from {fla.__file__}"


def _runners(args, arrays, dtype_name, *, fla_rule=None):
    """{name: runner} in IMPLS order; fla only when fla_rule is given (the timed dtype)."""
    torch_dtype = TORCH_DTYPES[dtype_name]
    hf_rule = _load_transformers_rule()
    from ..torch_gdn.chunk import chunk_gated_delta_rule

    common = dict(device=args.device, dtype=torch_dtype, chunk_size=args.chunk_size)
    runners = {
        "ours_torch": torch_rule_runner(chunk_gated_delta_rule, arrays, transformers_api=False,
                                        **common),
        "transformers": torch_rule_runner(hf_rule, arrays, transformers_api=True, **common),
    }
    if fla_rule is not None:  # same keywords as transformers' rule
        runners["fla"] = torch_rule_runner(fla_rule, arrays, transformers_api=True, **common)
    jax_run, jax_note = jax_rule_runner(arrays, device=args.device, dtype=dtype_name,
                                        chunk_size=args.chunk_size)
    if jax_run is not None:
        runners["ours_jax"] = jax_run
        if args.old_inverse:
            runners["jax_old_inv"], _ = jax_rule_runner(
                arrays, device=args.device, dtype=dtype_name, chunk_size=args.chunk_size,
                product_form_inverse=True)
    return {name: runners[name] for name in IMPLS if name in runners}, jax_note


def check_fla(fla_run, reference, dtype_name) -> tuple[float, float, bool]:
    """(output rel err, worst input-grad rel err, within tolerance) of fla vs `reference`,
    the (o, grads) of our float32 torch rule on the same inputs."""
    o, grads = fla_run()
    ref_o, ref_grads = reference
    o_err = rel_err(ref_o, o)
    g_err = max(rel_err(r, g) for r, g in zip(ref_grads, grads))
    ok = o_err <= FLA_OUTPUT_TOLERANCE[dtype_name] and g_err <= FLA_GRAD_TOLERANCE[dtype_name]
    return o_err, g_err, ok


def verify(runners) -> dict[str, tuple[float, float]]:
    """Run each implementation once; return {name: (output rel err, worst grad rel err)} vs HF."""
    results = {name: run() for name, run in runners.items()}
    ref_o, ref_grads = results["transformers"]
    errors = {}
    for name, (o, grads) in results.items():
        if name not in ("transformers", *UNCHECKED):
            errors[name] = (rel_err(ref_o, o),
                            max(rel_err(r, g) for r, g in zip(ref_grads, grads)))
    return errors



def _gemm_probe(device: str, reps: int) -> Callable[[], None]:
    """A runner doing `reps` float32 GEMMs, timed in the same alternation as the kernels."""
    n = CALIBRATION_GEMM_SIZE[device]
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    out = torch.empty(n, n, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run():
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        sync()

    return run


def _peaks(device: str) -> list[tuple[str, float, str]]:
    """Up-front (label, FLOP/s, source) peaks: a float32 GEMM, and on CUDA bf16 and the table."""
    n = CALIBRATION_GEMM_SIZE[device]
    fp32 = measure_gemm_flops_per_s(device=device, size=n, seconds=2.0)
    peaks = [("fp32 GEMM, up front", fp32.flops_per_s, fp32.source)]
    if device == "cuda":
        peaks[0] = ("fp32 GEMM, up front", fp32.flops_per_s, fp32.source + ":allow_tf32="
                    f"{torch.backends.cuda.matmul.allow_tf32}")
        bf16 = measure_gemm_flops_per_s(device=device, size=n, seconds=2.0, dtype=torch.bfloat16)
        peaks.append(("bf16 GEMM", bf16.flops_per_s, bf16.source))
        kind = accelerator_type_from_device_name(torch.cuda.get_device_name())
        if kind is not None:
            for dtype, tag in (("bfloat16", "bf16"), ("float32", "fp32")):
                peaks.append((f"{kind} {tag} table", peak_flops_per_chip(kind, dtype),
                              peak_source(kind, dtype)))
    return peaks


def correlated_key_errors(args, shape, dtype_name, *, fla_rule=None) -> dict[str, float]:
    """Each implementation's output error vs the float64 recurrence on correlated keys."""
    arrays = correlated_inputs(**shape, cosine=COSINE, seed=args.seed)
    # Rounded to the timed dtype once, so the float64 reference sees the same inputs.
    arrays = {n: torch.from_numpy(a).to(TORCH_DTYPES[dtype_name]).float().numpy()
              for n, a in arrays.items()}
    reference = float64_output(arrays)
    runners, _ = _runners(args, arrays, dtype_name, fla_rule=fla_rule)
    return {name: rel_err(reference, run()[0]) for name, run in runners.items()}


def add_fla_anchor(runners, fla_rule, args, arrays, *, reference) -> tuple[dict, bool, str | None]:
    """(runners with fla in table order, True, None) once fla matches `reference` (our float32
    torch rule's (o, grads) on the same inputs); (runners, False, None) when it disagrees. If
    fla refuses its backward, (runners, True, its reason); if it fails otherwise, that is
    printed and runners come back without it: the anchor's failure is not ours."""
    fla_run = torch_rule_runner(fla_rule, arrays, device=args.device,
                                dtype=TORCH_DTYPES[args.dtype], chunk_size=args.chunk_size,
                                transformers_api=True)
    try:
        o_err, g_err, ok = check_fla(fla_run, reference, args.dtype)
    except Exception as err:  # noqa: BLE001 - any failure inside fla/Triton
        if is_fla_backward_refusal(err):
            return runners, True, f"fla raised: {err}"
        print(f"fla: failed to run ({type(err).__name__}: {err}); timing without it")
        return runners, True, None
    print(f"check fla ({args.dtype}) vs ours_torch (float32): output rel err {o_err:.2e} "
          f"(tolerance {FLA_OUTPUT_TOLERANCE[args.dtype]:.0e}), worst input-grad rel err "
          f"{g_err:.2e} (tolerance {FLA_GRAD_TOLERANCE[args.dtype]:.0e})")
    if not ok:
        print("FAILED: fla and our rule disagree beyond the tolerance; not timing")
        return runners, False, None
    runners = dict(runners, fla=fla_run)
    return {name: runners[name] for name in IMPLS if name in runners}, True, None


def _print_table(times, flops, peaks, accuracy) -> None:
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    ref = medians["transformers"]
    labels = [f"of {label}" for label, _, _ in peaks]
    widths = [len(label) + 3 for label in labels]
    err_label = f"err c={COSINE:g}"
    print(f"{'impl':<13}{'median s':>10}{'min s':>9}{'max s':>9}{'/ HF time':>11}{'GFLOP/s':>10}"
          f"{err_label:>13}" + "".join(f"{label:>{w}}" for label, w in zip(labels, widths)))
    for name, med in medians.items():
        achieved = flops / med
        print(f"{name:<13}{med:>10.4f}{min(times[name]):>9.4f}{max(times[name]):>9.4f}"
              f"{med / ref:>11.3f}{achieved / 1e9:>10.2f}{accuracy[name]:>13.1e}"
              + "".join(f"{achieved / value:>{w}.2%}" for (_, value, _), w in zip(peaks, widths)))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shape = dict(batch=args.batch, seq_len=args.seq_len, num_k_heads=args.num_k_heads,
                 num_v_heads=args.num_v_heads, head_k_dim=args.head_k_dim,
                 head_v_dim=args.head_v_dim)
    flops = 3 * gdn_rule_flops(**shape, chunk_size=args.chunk_size).total
    print(f"kernel benchmark: B={args.batch} T={args.seq_len} Hk={args.num_k_heads} "
          f"Hv={args.num_v_heads} Dk={args.head_k_dim} Dv={args.head_v_dim} "
          f"C={args.chunk_size} dtype={args.dtype} l2norm=on device={args.device} "
          f"torch.get_num_threads()={torch.get_num_threads()}")
    print(f"rule FLOPs fwd+bwd (gdn_rule_flops x 3): {flops:.4e}")
    peaks = _peaks(args.device)
    for label, value, source in peaks:
        print(f"peak {label}: {value / 1e9:.1f} GFLOP/s ({source})")

    arrays = make_inputs(**shape, seed=args.seed)
    if args.dtype != "float32":  # round once, so the float32 check sees the timed values
        arrays = {n: torch.from_numpy(a).to(TORCH_DTYPES[args.dtype]).float().numpy()
                  for n, a in arrays.items()}
    fla_rule, fla_note = load_fla_rule(args.device)
    print(fla_note)
    check_runners, jax_note = _runners(args, arrays, "float32")
    print(f"JAX device: {jax_note}")
    errors = verify(check_runners)
    for name, (o_err, g_err) in errors.items():
        print(f"check vs transformers (float32): {name:<11} output rel err {o_err:.2e}, "
              f"worst input-grad rel err {g_err:.2e}")
    wrong = [name for name, (o_err, g_err) in errors.items()
             if not (o_err <= OUTPUT_TOLERANCE and g_err <= GRAD_TOLERANCE)]
    if wrong:
        print(f"FAILED: {', '.join(wrong)} off transformers by more than {OUTPUT_TOLERANCE:.0e} "
              f"(output) or {GRAD_TOLERANCE:.0e} (gradients); not timing a wrong kernel")
        return 1
    runners = check_runners if args.dtype == "float32" else _runners(args, arrays, args.dtype)[0]
    fla_refusal = fla_backward_refusal() if fla_rule is not None else None
    if fla_rule is not None and fla_refusal is None:
        runners, fla_agrees, fla_refusal = add_fla_anchor(
            runners, fla_rule, args, arrays, reference=check_runners["ours_torch"]())
        if not fla_agrees:
            return 1
    if fla_refusal is not None and not time_fla_forward_only(
            fla_rule, args, arrays, flops / 3, reason=fla_refusal):
        return 1
    if fla_rule is not None:
        fla_rule = fla_rule if "fla" in runners else None
    accuracy = correlated_key_errors(args, shape, args.dtype, fla_rule=fla_rule)
    for name, err in accuracy.items():
        print(f"correlated keys (cosine {COSINE:g}, {args.dtype}) vs float64 recurrence: "
              f"{name:<12} output rel err {err:.2e}")

    # A float32 GEMM probe of about 0.25 s runs in the same alternation: on a shared, noisy
    # host it sees the same contention as the kernels, so the fractions compare like with like.
    n = CALIBRATION_GEMM_SIZE[args.device]
    reps = max(1, round(0.25 * peaks[0][1] / (2 * n ** 3)))
    times = time_alternating({**runners, "gemm": _gemm_probe(args.device, reps)},
                             warmup=args.warmup, repeats=args.repeats)
    gemm_flops_per_s = reps * 2 * n ** 3 / statistics.median(times.pop("gemm"))
    peaks.insert(0, ("fp32 GEMM, interleaved", gemm_flops_per_s,
                     f"median of {args.repeats} x {reps} {n}^3 GEMMs between the kernel runs"))
    print(f"peak fp32 GEMM, interleaved: {gemm_flops_per_s / 1e9:.1f} GFLOP/s "
          f"({peaks[0][2]})")
    print(f"\nfwd+bwd, {args.repeats} timed runs each, alternating after {args.warmup} warm-up")
    _print_table(times, flops, peaks, accuracy)
    if fla_refusal is not None:
        print(f"fla: no fwd+bwd row: its backward was not run ({fla_refusal}); its forward "
              "alone is timed above")
    if "jax_old_inv" in times:
        ratio = statistics.median(times["jax_old_inv"]) / statistics.median(times["ours_jax"])
        print(f"JAX rule time, product-form inverse / blockwise inverse: {ratio:.2f}x")
        if args.inverse_blocks > 0:
            rows = compare_inverses(blocks=args.inverse_blocks, chunk=64, dim=args.head_k_dim)
            print_inverse_comparison(rows, blocks=args.inverse_blocks, chunk=64)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
