"""Test-wide setup: simulate 8 CPU devices before JAX starts, so mesh tests can run anywhere;
one persistent compilation cache for the whole session (and the subprocesses it starts); and
the fixtures several test modules share.

Tiers (docs/design.md#tests): `pytest -m "not slow"` is the fast tier, `pytest -m slow` the rest.
"""

import os
from pathlib import Path

import pytest

# Must happen before the first `import jax` anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Subprocesses (launch.py, multi-process workers, sidecars) import this tree's package, not
# whichever checkout an editable install points at.
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _ROOT]
)

# JAX's persistent compilation cache, where launch.py keeps it (dynamo_jax/cli.py
# `compilation_cache_dir`: $JAX_COMPILATION_CACHE_DIR, else ~/.cache/dynamo_jax/jax), outside the
# checkout: most tests compile the same few tiny programs, so every test after the first (in
# this session, in the xdist workers and the launch.py subprocesses, in later sessions and in
# other clones) loads them instead. Entries are keyed by the program and the compiler, so a
# stale entry is never used. The environment reaches subprocesses; jax.config below covers a
# jax imported before this file. JAX_COMPILATION_CACHE_DIR= (empty) runs without a cache.
from dynamo_jax.cli import compilation_cache_dir  # noqa: E402  (imports no jax)

JAX_CACHE_DIR = compilation_cache_dir(os.environ)
if JAX_CACHE_DIR:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = JAX_CACHE_DIR
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# JAX's switch for compiling fast (XLA backend optimisation level 0, LLVM's expensive passes
# off) takes about a third off the CPU time of a compile-bound test module, but it is off by
# default: it changes what some programs compute at the last bits (the extreme-logit entropy
# test in test_losses_logprobs.py fails under it), so the suite tests the programs users run.
# JAX_DISABLE_MOST_OPTIMIZATIONS=1 turns it on for a quicker local pass.
_FAST_COMPILE = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS", "0").lower() in (
    ("y", "yes", "t", "true", "on", "1")  # jax's own reading of a boolean variable
)


def pytest_configure(config):
    import jax

    if JAX_CACHE_DIR:
        jax.config.update("jax_compilation_cache_dir", JAX_CACHE_DIR)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_disable_most_optimizations", _FAST_COMPILE)


@pytest.fixture(scope="session")
def jax_cache_dir() -> str | None:
    """The session's persistent compilation cache (set for every test and subprocess; None
    without one)."""
    return JAX_CACHE_DIR


def pytest_collection_modifyitems(config, items):
    """Tests that start the real vLLM sidecar (marker `vllm`) spend tens of seconds per vLLM
    start-up on a CPU machine: they belong to the slow tier with the other long tests."""
    for item in items:
        if item.get_closest_marker("vllm") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def step_setups():
    """Per tiny preset: (cfg, params, batch) of the train-step tests (tests/helpers/step_setups.py),
    built once for tests/test_step_train_step.py and tests/test_step_on_policy.py. Read-only."""
    from helpers.step_setups import MODELS, make_batch, sharp_model

    out = {}
    for name in MODELS:
        cfg, params = sharp_model(name)
        out[name] = (cfg, params, make_batch(cfg, params))
    return out


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """(config, workdir) of a finished 6-step run with checkpoints at steps 3 and 6, shared by
    every module that uses it: tests copy the workdir before changing anything."""
    from helpers.train_runs import _short_config

    from dynamo_jax.config import from_config_dict
    from dynamo_jax.loop import train

    workdir = tmp_path_factory.mktemp("finished") / "run"
    config = _short_config(method="grpo", steps=6, every=3)
    train.run(from_config_dict(config), workdir)
    return config, workdir
