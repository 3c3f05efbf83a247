"""benchmarks/compile_time.py: its compile log, the programs a short run compiles, and the
persistent compilation cache across two checkouts.

Oracles: JAX compiles a jitted function once per distinct input shape, so the log's counts are
known exactly; a run's programs are the table below, measured once (a new program, or one
compiled twice, fails it); a cache entry either serves the second checkout or it does not (its
miss and hit events say which).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
ct = load_script("benchmarks/compile_time.py")


def test_compile_log_counts_one_compilation_per_shape():
    def double_plus_one(x):
        return 2 * x + 1

    f = jax.jit(double_plus_one)
    three, other_three, five, seven = (
        jnp.asarray(np.arange(n, dtype=np.float32)) for n in (3, 3, 5, 7)
    )
    with ct.CompileLog() as log:
        f(three)
        f(other_three)  # same shape: no new program
        f(five)
    f(seven)  # after the log is closed: not logged
    assert [c.name for c in log.compiled] == ["jit(double_plus_one)"] * 2
    assert all(
        c.seconds > 0 and c.site.startswith("test_benchmarks_compile_time.py:")
        for c in log.compiled
    )


# The short run: the README's tiny config, an evaluation and a checkpoint after every step.
RUN_ARGS = (
    "--config.eval.every_steps=1",
    "--config.checkpoint.every_steps=1",
    "--config.logging.progress_bar=False",
    "--config.logging.tensorboard=False",
    "--config.logging.plots_at_end=False",
)
# (JAX's name, the module that called it): programs compiled, measured at this commit. A new
# program (or a second compilation of one) is a regression to look at: update the table only
# with the reason in the commit (benchmarks/compile_time.py prints each one's compile time).
EXPECTED_PROGRAMS = {
    # the training state: the key, random parameters, optimizer state and step in one program
    ("jit(fresh_state)", "dynamo_jax/step/state.py"): 1,
    ("jit(convert_element_type)", "dynamo_jax/sharding/rules.py"): 1,  # optax's placeholder init
    ("jit(stage)", "dynamo_jax/loop/train.py"): 1,  # the run's base key, checkpointed
    ("jit(_threefry_seed)", "dynamo_jax/loop/train.py"): 1,
    ("jit(convert_element_type)", "dynamo_jax/rollout/jax_engine.py"): 1,
    ("jit(stage)", "dynamo_jax/rollout/jax_engine.py"): 1,
    ("jit(_row_keys)", "dynamo_jax/rollout/sampling.py"): 1,
    # the training batch's prefill, and the evaluation's (25 problems: 32 prompt slots, not 16)
    ("jit(_prefill_program)", "dynamo_jax/rollout/jax_engine.py"): 2,
    ("jit(_decode_program)", "dynamo_jax/rollout/jax_engine.py"): 1,  # shared by both
    ("jit(sequence_advantages)", "dynamo_jax/loop/assemble.py"): 1,
    ("jit(fn)", "dynamo_jax/step/forward.py"): 1,  # the log-prob pass
    ("jit(step)", "dynamo_jax/loop/rl_step.py"): 1,  # the update
    # checksums of params, opt_state and progress, in one program
    ("jit(<lambda>)", "dynamo_jax/checkpoint_checksums.py"): 1,
}


def _programs(record: dict) -> Counter:
    return Counter((c["name"], c["site"].rsplit(":", 1)[0]) for c in record["compiled"])


def _after_first_step(record: dict) -> list[dict]:
    """The compilations that ended after the second step started."""
    return [c for c in record["compiled"] if c["ended_at"] > record["step_starts"][1]]


@pytest.mark.slow
def test_a_short_run_compiles_each_program_once_and_a_resume_nothing_new(tmp_path, jax_cache_dir):
    """Two steps, each evaluated and checkpointed, then resumed for two more in a new
    process: the programs are the table's, every one compiled in the first step (the
    evaluation's and checkpoint's included), none after it, and the resumed run compiles
    nothing after its first step."""
    cache = Path(jax_cache_dir or tmp_path / "cache")
    workdir = tmp_path / "run"
    fresh = ct.run_worker("configs/tiny.py", 2, cache, extra_args=RUN_ARGS, workdir=workdir)
    assert fresh["exit_code"] == 0 and len(fresh["step_ends"]) == 2
    assert dict(_programs(fresh)) == EXPECTED_PROGRAMS
    assert _after_first_step(fresh) == []
    resumed = ct.run_worker("configs/tiny.py", 4, cache, extra_args=RUN_ARGS, workdir=workdir)
    assert resumed["exit_code"] == 0 and len(resumed["step_ends"]) == 2  # steps 3 and 4
    assert _after_first_step(resumed) == []
    assert set(_programs(resumed)) <= set(EXPECTED_PROGRAMS)


# The program the cross-clone test compiles: the tiny model's forward and the GRPO advantages,
# from the package of the checkout it runs in; it prints the cache's verdicts as JSON.
CLONE_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring
import dynamo_jax
from dynamo_jax.losses.advantages import grpo_advantages
from dynamo_jax.models import qwen
from dynamo_jax.models.presets import get_preset

events = []
monitoring.register_event_listener(lambda event, **_: events.append(event))
cfg = get_preset("tiny-qwen3", vocab_size=32, scan_layers=False)
params = jax.tree.map(lambda s: jnp.full(s.shape, 0.01, s.dtype), qwen.param_shapes(cfg))

def program(params, tokens, rewards, groups):
    logits = qwen.Transformer(cfg).apply({"params": params}, tokens, tokens, jnp.ones_like(tokens))
    return logits.sum() + grpo_advantages(rewards, groups).sum()

args = (params, jnp.ones((2, 4), jnp.int32), jnp.arange(4.0), jnp.array([0, 0, 1, 1]))
lowered = jax.jit(program).lower(*args)
program_text = lowered.as_text(debug_info=True)
jax.block_until_ready(lowered.compile()(*args))
print(json.dumps({
    "package": dynamo_jax.__file__,
    "path_in_program": dynamo_jax.__file__.rsplit("/", 1)[0] in program_text,
    "misses": events.count("/jax/compilation_cache/cache_misses"),
    "hits": events.count("/jax/compilation_cache/cache_hits"),
}))
"""


def _run_in_checkout(checkout: Path, cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout), JAX_COMPILATION_CACHE_DIR=str(cache))
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", CLONE_SCRIPT], cwd=checkout, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cache_filled_in_one_checkout_serves_another(tmp_path):
    """The package copied into two directories of different names and depths: the program
    carries each copy's path in its locations, yet the second copy loads every program the
    first one compiled and writes nothing (JAX keys the cache on the program without its
    debug info)."""
    cache = tmp_path / "cache"
    first, second = tmp_path / "a", tmp_path / "another" / "checkout-elsewhere"
    for checkout in (first, second):
        shutil.copytree(
            ROOT / "dynamo_jax",
            checkout / "dynamo_jax",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    a = _run_in_checkout(first, cache)
    entries = set(os.listdir(cache))
    b = _run_in_checkout(second, cache)
    assert a["package"].startswith(str(first)) and b["package"].startswith(str(second))
    assert a["path_in_program"] and b["path_in_program"]
    assert a["misses"] >= 1 and a["hits"] == 0
    assert (b["misses"], b["hits"]) == (0, a["misses"])
    assert set(os.listdir(cache)) == entries


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"JAX_COMPILATION_CACHE_DIR": "/c/jax", "DYNAMO_JAX_CACHE": "/d"}, "/c/jax"),
        ({"JAX_COMPILATION_CACHE_DIR": "", "DYNAMO_JAX_CACHE": "/d"}, None),
        ({"DYNAMO_JAX_CACHE": "/d"}, "/d/jax"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/dynamo_jax/jax"),
    ],
)
def test_the_cache_directory_of_runs_and_tests(monkeypatch, environ, expected):
    from dynamo_jax import cli

    for name in ("JAX_COMPILATION_CACHE_DIR", "DYNAMO_JAX_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert cli.compilation_cache_dir(os.environ) == expected
    env = dict(environ)
    assert cli.use_compilation_cache(env) == expected
    if expected:  # for launch.py's subprocesses too; every program written
        assert env["JAX_COMPILATION_CACHE_DIR"] == expected
        assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
