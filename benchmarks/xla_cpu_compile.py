"""XLA:CPU options against the compile time of the tiny run's update, and whether they keep its bits.

    python -m benchmarks.xla_cpu_compile xla_backend_optimization_level=1 \
        xla_cpu_parallel_codegen_split_count=1

The update (`jit(step)`) is the largest program the README's run compiles (about half of its
cold compile time: benchmarks/README.md#compile-time). This builds that run's trainer
(configs/tiny.py), lowers its update once for the layout's largest batch, and compiles it with
the trainer's options (dynamo_jax/step/xla_options.py) and then with each `NAME=VALUE` added,
the persistent cache off. Each program runs one update on the same state and the same batch
(random tokens, half of each row trained); a variant that changes any bit of the new
parameters or the metrics computes something else, which the trainer's tests and the runs'
bit-identity comparisons would then have to re-establish. Prints compile CPU seconds, the
update's median run time and the verdict on the bits.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import header


def _options(text: str) -> dict[str, str | bool | int]:
    """`NAME=VALUE` as a compiler option: XLA takes a bool or an int as one, not its text."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"error: {text!r}: give an option as NAME=VALUE")
    if value.lower() in ("true", "false"):
        return {name: value.lower() == "true"}
    return {name: int(value) if value.lstrip("-").isdigit() else value}


def tiny_update(workdir: Path):
    """(lowered update, state, batch of NumPy arrays) of the tiny run's first update."""
    import jax

    from configs import tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.loop.build import build_trainer
    from dynamo_jax.step.planner import abstract_batch

    cfg = from_config_dict(tiny.get_config(None))
    trainer = build_trainer(cfg, workdir)
    layout, step = trainer.layouts.update, trainer.train_step
    abstract = abstract_batch(step.batch_shardings, layout.max_rows, layout.row_len)
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), trainer.state
    )
    rng = np.random.default_rng(0)
    rows, length = layout.max_rows, layout.row_len
    batch = {
        "tokens": rng.integers(1, cfg.model.vocab_size, (rows, length)),
        "positions": np.broadcast_to(np.arange(length), (rows, length)),
        "segment_ids": np.ones((rows, length)),
        "loss_mask": np.broadcast_to(np.arange(length) >= length // 2, (rows, length)),
        "advantages": rng.standard_normal((rows, length)),
        "old_logp": -2.0 + 0.1 * rng.standard_normal((rows, length)),
        "temperature": 0.7,
        "on_policy": 0.0,
    }
    missing = set(abstract) - set(batch)
    if missing:
        raise SystemExit(
            f"error: the tiny update reads fields this script does not fill: {missing}"
        )
    batch = {k: np.asarray(batch[k], abstract[k].dtype) for k in abstract}
    return step.fn.lower(state, abstract), trainer.state, batch


def measure(lowered, state, batch, options: dict, runs: int = 3) -> tuple[float, float, list]:
    """(compile CPU s, median run s, output leaves as NumPy) under `options`."""
    import jax
    import jax.numpy as jnp

    start = time.process_time()
    compiled = lowered.compile(compiler_options=options)
    compile_s = time.process_time() - start
    seconds, out = [], None
    for _ in range(runs):
        fresh = jax.tree.map(jnp.copy, state)  # the update donates its state
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(fresh, batch))
        seconds.append(time.perf_counter() - start)
    new_state, metrics = out
    leaves = [np.asarray(x) for x in jax.tree.leaves((new_state.params, metrics))]
    return compile_s, statistics.median(seconds[1:] or seconds), leaves


def same_bits(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("options", nargs="*", help="XLA options NAME=VALUE, one variant each")
    args = parser.parse_args(argv)
    variants = [_options(text) for text in args.options]

    import jax

    cached = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # compile every variant for real
    try:
        return _table(variants)
    finally:
        jax.config.update("jax_enable_compilation_cache", cached)


def _table(variants: list[dict]) -> list[dict]:
    from dynamo_jax.step.xla_options import _CPU_TRAINER_OPTIONS

    with tempfile.TemporaryDirectory(prefix="xla_cpu_compile_") as workdir:
        lowered, state, batch = tiny_update(Path(workdir))
    print(header("the tiny run's update under XLA:CPU options"))
    print("| options | compile CPU s | run ms (median) | same bits as the trainer's |")
    print("|---|---|---|---|")
    rows, base = [], None
    for extra in [{}, *variants]:
        compile_s, run_s, leaves = measure(lowered, state, batch, {**_CPU_TRAINER_OPTIONS, **extra})
        same = True if base is None else same_bits(base, leaves)
        base = leaves if base is None else base
        name = ", ".join(f"{k}={v}" for k, v in extra.items()) or "the trainer's"
        print(f"| {name} | {compile_s:.2f} | {1000 * run_s:.1f} | {'yes' if same else 'no'} |")
        rows.append({"options": extra, "compile_s": compile_s, "run_s": run_s, "same": same})
    return rows


if __name__ == "__main__":
    main()
