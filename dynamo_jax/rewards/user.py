"""A user's own reward function (`reward.function = "path/to/file.py:name"`), verl's signature.

    def name(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None)
        -> float | dict  # a dict must hold a numeric "score"; other keys are ignored

It runs in the reward worker processes in place of the math-verify scorer, under the same
CPU-time limit, memory cap and kill-and-replace handling, and never inside the trainer. What
each outcome becomes (also in docs/rewards.md):

- a finite number (or bool, or a dict with a finite numeric "score"): that reward, status
  "correct" when it is > 0, else "wrong";
- an exception (SystemExit included), or junk (None, a string, NaN, a dict without "score"):
  `wrong_reward`, status "parse_error", and the detail names the function and what happened;
  the pool logs a warning for every batch where that happens, so it is never silent;
- more than `timeout_s` CPU seconds: status "timeout" (the worker interrupts it, or the pool
  kills and replaces the worker); blocked without using CPU (a sleep, a lock): killed at
  `wall_timeout_s`, status "timeout";
- the process dies (os._exit, a crash): status "parse_error", the worker is replaced.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from dynamo_jax.rewards.config import RewardConfig, split_function_spec
from dynamo_jax.rewards.math_check import (
    DeadlineExceeded,
    make_verdict,
    precheck,
    time_limit,
)
from dynamo_jax.rewards.verdict import Verdict

# The detail of every verdict about a failing user function starts with this.
FAILED = "reward.function"
_MAX_DETAIL = 160


def absolute_spec(spec: str) -> str:
    """`spec` with its file made absolute (the workers may start in another directory)."""
    path, name = split_function_spec(spec)
    return f"{os.path.abspath(path)}:{name}"


def load_function(spec: str) -> Callable:
    """Import the file as a module of its own and return its callable `name` (raises ValueError)."""
    path, name = split_function_spec(spec)
    module_name = f"_dynamo_jax_user_reward_{Path(path).stem}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(f"reward.function: cannot import {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as exc:  # the user's module-level code, reported in one line
        raise ValueError(
            f"reward.function: importing {path} raised {type(exc).__name__}: {exc}"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        found = "is not callable" if hasattr(module, name) else "is not defined"
        raise ValueError(f"reward.function: {name!r} {found} in {path}")
    return function


def _score_of(result) -> float | None:
    if isinstance(result, dict):
        result = result.get("score")
    if isinstance(result, bool):
        return float(result)
    if isinstance(result, int | float) and math.isfinite(result):
        return float(result)
    return None


def _short(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL] + "..."


def score_user(
    function: Callable, text, gold: str, source: str | None, extra_info, cfg: RewardConfig
) -> Verdict:
    """One verdict from the user's function within `cfg.timeout_s` CPU seconds (main thread)."""
    early = precheck(text, cfg)
    if early is not None:
        return early
    try:
        with time_limit(cfg.timeout_s):
            result = function(source, text, gold, extra_info)
    except DeadlineExceeded:
        return make_verdict("timeout", cfg, detail=f"exceeded {cfg.timeout_s} CPU s")
    except BaseException as exc:  # the user's code: any failure is this item's verdict
        return make_verdict(
            "parse_error", cfg, detail=_short(f"{FAILED} raised {type(exc).__name__}: {exc}")
        )
    score = _score_of(result)
    if score is None:
        return make_verdict(
            "parse_error",
            cfg,
            detail=_short(f"{FAILED} returned {type(result).__name__} {result!r}, not a score"),
        )
    return Verdict(score, "correct" if score > 0 else "wrong", None, "")
