#!/usr/bin/env bash
# The project's GPU checks in one run (about 10 minutes on one H100), each under its own time limit
# so that one hung check still leaves the others' output:
#   1. the embedded engine against transformers' generate on the same GPU and weights
#      (float32 agreement, then bf16 tokens/s): scripts/gpu_check_engine.py;
#   2. the attention paths (Pallas flash kernel, cuDNN) against "blockwise": scripts/gpu_check_attention.py;
#   3. the train step's model FLOPs utilisation at Qwen2.5-0.5B: benchmarks/step_throughput.py --mfu;
#   4. the model, decode and engine tests on the GPU (float32 matmuls at full precision).
#
#   bash scripts/gpu_checks.sh [OUTDIR]      # logs and JSON under OUTDIR (default ./gpu_checks)
#
# Needs JAX with CUDA, torch and transformers, plus the project's dependencies
# (pip install -e '.[test]' or the wheels on PYTHONPATH).
set -u
out=${1:-gpu_checks}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
status=0
run() {  # run NAME SECONDS CMD...: log to OUTDIR/NAME.log, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
nvidia-smi -L || true
$py -c "import jax; print('jax', jax.__version__, jax.devices())"
# 4 layers: at 24 the float32 check alone outlasted 240 s on an H200 (compiles; not yet timed)
run engine 300 $py scripts/gpu_check_engine.py --layers 4 --prompts 32 --samples 4 --new 128 \
    --rounds 2 --check_prompts 4 --check_new 16 --out "$out/engine.json"
run attention 150 $py scripts/gpu_check_attention.py --lengths 1024,4096,8192
run mfu 150 $py benchmarks/step_throughput.py --mfu --preset qwen2.5-0.5b --layers 0 \
    --batch 8 --seq 2048 --dtype bfloat16 --attention pallas --residuals recompute \
    --full_depth_batch 0 --no-torch --iters 3 --peak_tflops 989
# tests/conftest.py defaults JAX to the CPU; these run on the GPU at full float32 precision.
run tests 300 env JAX_PLATFORMS=cuda,cpu JAX_DEFAULT_MATMUL_PRECISION=highest \
    $py -m pytest -q -rf -p no:cacheprovider tests/test_models_decode.py tests/test_models_qwen.py \
    tests/test_rollout_jax_engine.py tests/test_step_on_policy.py
exit $status
