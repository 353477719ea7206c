#!/usr/bin/env bash
# Device check for a machine with one NVIDIA GPU (issues 9 and 23), from the checkout on
# gdn_core alone: PYTHONPATH=., no install, no network, no Ray/FastAPI/SQLAlchemy. Needs
# python3 with torch (CUDA), jax (CUDA), optax, transformers, pytest and pytest-timeout.
#
#   bash scripts/device-check.sh                 # on the GPU machine: under 8 minutes, cold
#   bash scripts/device-check.sh --cpu-dry-run   # every part on CPU at toy sizes (slow, no limit)
#
# Parts, each under `timeout` (limits sum to 470 s; a failed or timed-out part is reported and
# the next one still runs; exit 1 if any part failed):
#   env     30 s   versions and devices (python -m gdn_core.bench env)
#   tests   120 s  the gpu-marked tests: rule, layer, model, training step on CUDA vs CPU
#   kernel  80 s   python -m gdn_core.bench kernel --device cuda: fla-core's Triton rule beside
#                  ours, alone, bf16, 8K tokens (Triton autotuning included)
#   step    240 s  python -m gdn_core.bench step: the sweep's own step (run_cp_training, one
#                  chip) for qwen3.5-0.8b as the hybrid decoder at full depth, 32K tokens, bf16:
#                  torch reference, torch fused, JAX reference, JAX fused. Its own budget,
#                  230 s (about 55 s a row; untimed on a GPU so far), stops a row that would
#                  overrun, reports it "not reached" and still prints the rows it finished.
#                  STEP_PRESET / STEP_LAYERS / STEP_SEQ_LEN override the point.
# Without a CUDA device it says so, runs the gpu tests (they skip) and exits 0.
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
case "${1:-}" in
    "") ;;
    --cpu-dry-run) DRY_RUN=1 ;;
    *) echo "usage: bash scripts/device-check.sh [--cpu-dry-run]" >&2; exit 2 ;;
esac

WORK=build/device-check
mkdir -p "$WORK"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee -a "$OUT/device-check.log") 2>&1
    TEE_PID=$!
fi
PYTHON=${PYTHON:-python3}

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
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch and JAX share the GPU in the tests' process
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
run_part env 30 bash -c '"$0" -m gdn_core.bench env 2>&1 | tee "$1"' "$PYTHON" "$ENV_LOG"
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
    run_part step 900 "$PYTHON" -m gdn_core.bench step --device cpu --preset tiny \
        --seq-len 64 --steps 1 --warmup 1 --budget-s 850
elif [ $CUDA -eq 0 ]; then
    echo
    echo "no CUDA device: the gpu tests skip; the kernel and step benchmarks need one"
    run_part tests 120 "${GPU_TESTS[@]}" -q -rs
else
    if [ $JAX_GPU -eq 0 ]; then
        echo "torch sees a CUDA device but JAX has no GPU backend: its gpu tests will skip"
        SUMMARY+=("jax gpu backend: FAILED (see env)")
        FAILED=1
    fi
    run_part tests 120 "${GPU_TESTS[@]}" -v --timeout=90
    run_part kernel 80 "$PYTHON" -m gdn_core.bench kernel --device cuda --dtype bfloat16 \
        --seq-len 8192 --num-k-heads 16 --num-v-heads 16 --repeats 3 --warmup 1 \
        --inverse-blocks 0 --no-old-inverse
    # The step module keeps its own budget (230 s) inside the part's limit, so it always
    # prints the table, with rows it could not reach marked as such (and exits 0 for them).
    STEP_LAYER_ARGS=()
    [ -n "${STEP_LAYERS:-}" ] && STEP_LAYER_ARGS=(--layers "$STEP_LAYERS")
    run_part step 240 "$PYTHON" -m gdn_core.bench step --device cuda \
        --preset "${STEP_PRESET:-qwen3.5-0.8b}" "${STEP_LAYER_ARGS[@]}" \
        --seq-len "${STEP_SEQ_LEN:-32768}" --dtypes bfloat16 --steps 2 --warmup 1 \
        --budget-s 230
fi

echo
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
if [ -n "${TEE_PID:-}" ]; then  # let tee finish the log before the exit code is returned
    exec >&- 2>&-
    wait "$TEE_PID"
fi
exit $FAILED
