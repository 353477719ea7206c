#!/usr/bin/env bash
# Device check for a machine with one NVIDIA GPU (issues 9 and 23), from the checkout on
# gdn_core alone: PYTHONPATH=., no install, no network, no Ray/FastAPI/SQLAlchemy. Needs
# python3 with torch (CUDA), jax (CUDA), optax, transformers, pytest and pytest-timeout.
#
#   bash scripts/device-check.sh                 # on the GPU machine: under 8 minutes, cold
#   bash scripts/device-check.sh --plan          # any machine, seconds, no GPU, no compile: the
#                                                # parts' limits and each step row's predicted
#                                                # memory per chip vs an H100 80GB / H200 141GB
#   bash scripts/device-check.sh --cpu-dry-run   # every part on CPU at toy sizes (slow, no limit)
#
# Parts, each under `timeout` (limits sum to 475 s; a failed or timed-out part is reported and
# the next one still runs; exit 1 if any part failed):
#   env     25 s   versions and devices (python -m gdn_core.bench env)
#   tests   105 s  the gpu-marked tests: rule, layer, model, training step on CUDA vs CPU (outside
#                  the default tier's 20 s per-test budget, tests/time_budget.py; 90 s a test)
#   kernel  70 s   python -m gdn_core.bench kernel --device cuda: fla-core's Triton rule beside
#                  ours, alone, bf16, 8K tokens (Triton autotuning in its untimed warm-up; where
#                  fla refuses its training backward, its forward alone, said so)
#   pallas  50 s   python -m gdn_core.bench.kernel_pallas --device cuda: the JAX rule, the
#                  reference XLA rule beside the Pallas chunk rule (jax_gdn.pallas, Triton),
#                  forward + backward, bf16, 32K tokens, 16 heads of 128 (checked against the
#                  XLA rule first; goal: >= 2x the XLA rule on an H100; needs JAX's GPU backend)
#   step    225 s  python -m gdn_core.bench step: the sweep's own step (run_cp_training, one
#                  chip) for qwen3.5-0.8b as the hybrid decoder at full depth (24 layers), 32K
#                  tokens, bf16, remat full (without it the predictor says ~202 GiB torch / 310
#                  GiB JAX per chip; with it ~27-32 GiB), 1 untimed warm-up step (fla's
#                  autotune, JAX's compile) + 2 timed: torch reference, torch fused (skipped
#                  where fla refuses its backward, with fla's reason), JAX reference, JAX fused
#                  (cuDNN attention). It prints the memory plan first; a row predicted over
#                  what its device can allocate is skipped before it runs. Its own budget,
#                  215 s (about 55 s a row; untimed on a GPU so far), stops a row that would
#                  overrun, reports it "not reached" and still prints the rows it finished.
#                  STEP_PRESET / STEP_LAYERS / STEP_SEQ_LEN / STEP_REMAT override the point.
# Without a CUDA device it says so, runs the gpu tests (they skip) and exits 0.
# JAX's allocator runs as the sweep's workers run it (gdn_core.device_memory.
# jax_gpu_allocator_env, the one owner of XLA_PYTHON_CLIENT_MEM_FRACTION): no preallocation, the
# trials' fraction, so what admission predicts against is what JAX here may take.
#
# Wheels: scripts/wheels/*.whl (fla-core 0.6.0 and its one dependency einops; pure Python,
# fla's kernels are Triton, which torch's CUDA build brings) are unpacked under
# build/device-check/site and put on PYTHONPATH, each only when its package is not importable
# already. Bring another the same way: pip download <name> --no-deps -d scripts/wheels.
# JAX's persistent compilation cache lives in build/device-check/jax-cache: a rerun on the same
# machine recompiles nothing. With $OUT set (the device tool sets it), the log goes to
# $OUT/device-check.log and the step table to $OUT/step-table.{json,md}.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
PLAN=0
case "${1:-}" in
    "") ;;
    --cpu-dry-run) DRY_RUN=1 ;;
    --plan) PLAN=1 ;;
    *) echo "usage: bash scripts/device-check.sh [--plan | --cpu-dry-run]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}

# Part limits in seconds (a cold H100 / H200 of the lent image; their sum stays under 480 s).
ENV_LIMIT_S=25
TESTS_LIMIT_S=105
KERNEL_LIMIT_S=70
PALLAS_LIMIT_S=50
STEP_LIMIT_S=225
STEP_BUDGET_S=215  # the step module's own budget, inside its part's limit
PALLAS_ARGS=(--dtype bfloat16 --seq-len 32768 --num-k-heads 16 --num-v-heads 16 --repeats 2
             --warmup 1)
STEP_ARGS=(--preset "${STEP_PRESET:-qwen3.5-0.8b}" --seq-len "${STEP_SEQ_LEN:-32768}"
           --remat "${STEP_REMAT:-full}" --dtypes bfloat16 --steps 2 --warmup 1)
[ -n "${STEP_LAYERS:-}" ] && STEP_ARGS+=(--layers "$STEP_LAYERS")

if [ $PLAN -eq 1 ]; then  # no wheels, no build folder, no GPU: shapes and arithmetic
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    echo "device-check parts and limits (a cold GPU; sum $((ENV_LIMIT_S + TESTS_LIMIT_S \
+ KERNEL_LIMIT_S + PALLAS_LIMIT_S + STEP_LIMIT_S)) s <= 480 s):"
    echo "  env     ${ENV_LIMIT_S} s   python -m gdn_core.bench env"
    echo "  tests   ${TESTS_LIMIT_S} s  the gpu-marked tests" \
         "(90 s a test, outside the 20 s budget)"
    echo "  kernel  ${KERNEL_LIMIT_S} s   python -m gdn_core.bench kernel --device cuda" \
         "(bf16, 8K tokens)"
    echo "  pallas  ${PALLAS_LIMIT_S} s   python -m gdn_core.bench.kernel_pallas --device cuda" \
         "${PALLAS_ARGS[*]}"
    echo "  step    ${STEP_LIMIT_S} s  python -m gdn_core.bench step --device cuda" \
         "${STEP_ARGS[*]} --budget-s ${STEP_BUDGET_S}"
    echo
    exec "$PYTHON" -m gdn_core.bench step --device cuda --plan "${STEP_ARGS[@]}" \
        --budget-s "$STEP_BUDGET_S"
fi

WORK=build/device-check
mkdir -p "$WORK"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee -a "$OUT/device-check.log") 2>&1
    TEE_PID=$!
fi

# Wheels brought in the tree, unpacked only for packages this Python lacks.
shopt -s nullglob
WHEELS=(scripts/wheels/*.whl)
if [ ${#WHEELS[@]} -gt 0 ]; then
    "$PYTHON" - "$WORK/site" "${WHEELS[@]}" <<'EOF'
import importlib.util, pathlib, sys, zipfile

site = pathlib.Path(sys.argv[1])
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        packages = sorted(t.removesuffix(".py") for t in tops
                          if not t.endswith((".dist-info", ".data")))
        present = [p for p in packages if importlib.util.find_spec(p) is not None]
        if present:
            print(f"{wheel}: {', '.join(present)} already importable, not unpacked")
            continue
        archive.extractall(site)
        print(f"{wheel}: unpacked into {site}")
EOF
fi
export PYTHONPATH="$PWD:$PWD/$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export JAX_PLATFORMS="${JAX_PLATFORMS-}"  # '': JAX initialises every backend present (gpu, cpu)
# No preallocation (torch and JAX share the GPU in the tests' process) and the trials' fraction:
# gdn_core.device_memory.jax_gpu_allocator_env, as the sweep's workers set them.
while IFS='=' read -r name value; do
    [ -n "$name" ] && export "$name=$value"
done < <("$PYTHON" -c 'from gdn_core.device_memory import jax_gpu_allocator_env as env
print("\n".join(f"{k}={v}" for k, v in env().items()))')
echo "JAX allocator: XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE-unset}" \
     "XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION-unset}"
export JAX_COMPILATION_CACHE_DIR="$PWD/$WORK/jax-cache"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY=true  # the step's bytes read its metadata
export PYTHONUNBUFFERED=1

FAILED=0
SUMMARY=()
run_part() {  # name limit_s command...: run under timeout, record ok / FAILED
    local name=$1 limit=$2
    shift 2
    echo
    echo "=== $name (limit ${limit} s): $*"
    local start=$SECONDS rc
    timeout --kill-after=5 "$limit" "$@"
    rc=$?
    local status="ok"
    if [ $rc -ne 0 ]; then
        status="FAILED (exit $rc)"
        [ $rc -eq 124 ] && status="FAILED (timed out after $limit s)"
        FAILED=1
    fi
    SUMMARY+=("$name: $status, $((SECONDS - start)) s")
}

# A module that fails to import (e.g. an older transformers) must not stop the others.
GPU_TESTS=("$PYTHON" -m pytest tests/gdn_core -m gpu -p no:cacheprovider
           -W ignore::DeprecationWarning --continue-on-collection-errors)
ENV_LOG="$WORK/env.txt"
run_part env "$ENV_LIMIT_S" bash -c '"$0" -m gdn_core.bench env 2>&1 | tee "$1"' \
    "$PYTHON" "$ENV_LOG"
CUDA=0
JAX_GPU=0
grep -q "^devices: cuda=1" "$ENV_LOG" && CUDA=1
grep -q "jax_gpu=1" "$ENV_LOG" && JAX_GPU=1

if [ $DRY_RUN -eq 1 ]; then
    echo "--cpu-dry-run: every part on CPU at toy sizes, without the 8-minute limits"
    run_part tests 600 "${GPU_TESTS[@]}" -v --timeout=300
    run_part kernel 600 "$PYTHON" -m gdn_core.bench kernel --device cpu --seq-len 192 \
        --num-k-heads 1 --num-v-heads 2 --head-k-dim 32 --head-v-dim 32 --repeats 1 \
        --warmup 0 --inverse-blocks 0 --no-old-inverse
    run_part pallas 600 "$PYTHON" -m gdn_core.bench.kernel_pallas --device cpu --interpret \
        --seq-len 192 --num-k-heads 1 --num-v-heads 2 --head-k-dim 32 --head-v-dim 32 \
        --repeats 1 --warmup 0
    run_part step 900 "$PYTHON" -m gdn_core.bench step --device cpu --preset tiny \
        --seq-len 64 --steps 1 --warmup 1 --budget-s 850
elif [ $CUDA -eq 0 ]; then
    echo
    echo "no CUDA device: the gpu tests skip; the kernel and step benchmarks need one"
    run_part tests "$TESTS_LIMIT_S" "${GPU_TESTS[@]}" -q -rs
else
    if [ $JAX_GPU -eq 0 ]; then
        echo "torch sees a CUDA device but JAX has no GPU backend: its gpu tests will skip"
        SUMMARY+=("jax gpu backend: FAILED (see env)")
        FAILED=1
    fi
    run_part tests "$TESTS_LIMIT_S" "${GPU_TESTS[@]}" -v --timeout=90
    run_part kernel "$KERNEL_LIMIT_S" "$PYTHON" -m gdn_core.bench kernel --device cuda \
        --dtype bfloat16 --seq-len 8192 --num-k-heads 16 --num-v-heads 16 --repeats 3 --warmup 1 \
        --inverse-blocks 0 --no-old-inverse
    if [ $JAX_GPU -eq 1 ]; then
        run_part pallas "$PALLAS_LIMIT_S" "$PYTHON" -m gdn_core.bench.kernel_pallas \
            --device cuda "${PALLAS_ARGS[@]}"
    else
        SUMMARY+=("pallas: not run (JAX has no GPU backend)")
    fi
    # The step module keeps its own budget inside the part's limit, so it always prints the
    # table, with rows it could not reach marked as such (and exits 0 for them).
    run_part step "$STEP_LIMIT_S" "$PYTHON" -m gdn_core.bench step --device cuda \
        "${STEP_ARGS[@]}" --budget-s "$STEP_BUDGET_S"
fi

echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
if [ -n "${TEE_PID:-}" ]; then  # let tee finish the log before the exit code is returned
    exec >&- 2>&-
    wait "$TEE_PID"
fi
exit $FAILED
