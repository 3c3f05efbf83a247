"""Score each item from the warm worker's state: in a fresh fork, or in place if no parser runs.

Clearing SymPy's and math-verify's caches (math_check._reset_state) is not enough for the work
an item does to be a function of the item alone: the ANTLR parser keeps the prediction states
(DFA) it built for every input it has seen, so the same answer made 315,038 calls in one
process and 7,102 in another that had parsed similar text before; the cyclic garbage collector
runs at points set by earlier allocations. A worker therefore never scores in its own process:
it forks, the child scores from the worker's warm state (identical in every worker: the same
warm-up, the same PYTHONHASHSEED) with the garbage collector off, sends the verdict back and
exits. The work budget (budget.py) then counts the same calls for the same input on every
machine, under any load, whatever came before.

The child also carries the CPU safety net itself: RLIMIT_CPU makes the kernel kill it at
`timeout_s + kill_grace_s` CPU seconds even inside C code no signal handler can interrupt, and
on Linux it dies with the worker (PR_SET_PDEATHSIG), so a worker killed by the pool leaves
nothing behind. A fork costs a few milliseconds.

What the fork protects is the parsers' state (ANTLR's DFA, SymPy's and math-verify's caches,
lazily imported modules). An item that never runs math-verify's parser (an integer answer
against an integer gold, an answer refused by a screen, no answer) is scored in the worker's
own process instead (`score_item`), from the same state a fork starts from: SymPy's caches
cleared (as in every item), the garbage collector off, and afterwards the `re` module's caches
put back as they were, so that the worker stays in its warm state for the items it forks. Its
call count, and so its verdict at any budget, is the fork's (tests/test_rewards_budget.py).
Where the item reaches the parser, `NeedsParser` stops it and it is scored in a fork.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import pickle
import re
import resource
import signal

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import NeedsParser, score_one, without_parser
from dynamo_jax.rewards.verdict import Verdict, make_verdict

_PR_SET_PDEATHSIG = 1


def available() -> bool:
    return hasattr(os, "fork")


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _child(write_fd: int, function, args, cpu_limit: int) -> None:
    gc.disable()
    _die_with_parent()
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 1))
    data = pickle.dumps(function(*args))
    with os.fdopen(write_fd, "wb") as out:
        out.write(data)


def _fork_call(function, args, cpu_limit: int) -> tuple[bytes, int]:
    """(pickled result or b"", wait status) of `function(*args)` run in a forked child."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, report, and leave without running the parent's cleanup
        code = 0
        try:
            os.close(read_fd)
            _child(write_fd, function, args, cpu_limit)
        except BaseException:  # noqa: BLE001 - reported to the parent as a dead child
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as result:
        data = result.read()
    _, status = os.waitpid(pid, 0)
    return data, status


def call_isolated(function, *args, cpu_limit: int = 3600):
    """`function(*args)` computed in a fresh fork of this process (tests measure work so)."""
    data, status = _fork_call(function, args, cpu_limit)
    if not data:
        raise RuntimeError(f"isolated call died (wait status {status})")
    return pickle.loads(data)


def score_isolated(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    """`score_one(text, gold, cfg)` in a forked child of this process (see module docstring)."""
    cpu_limit = math.ceil(cfg.timeout_s + cfg.kill_grace_s)
    data, status = _fork_call(score_one, (text, gold, cfg), cpu_limit)
    if data:
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 - a truncated write from a child killed mid-way
            pass
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
        return make_verdict("timeout", cfg, detail=f"killed at the {cpu_limit} CPU s limit")
    return make_verdict("parse_error", cfg, detail=f"scoring process died (status {status})")


# The `re` module's memo of compiled replacement templates (an lru_cache: it can be emptied,
# not put back); its name changed in Python 3.12.
_RE_TEMPLATES = getattr(re, "_compile_repl", None) or getattr(re, "_compile_template", None)


def forget_regex_templates() -> None:
    """Empty `re`'s template cache: the worker's warm state holds none (worker.warm_up)."""
    if _RE_TEMPLATES is not None:
        _RE_TEMPLATES.cache_clear()


def _score_without_parser(text: str, gold: str, cfg: RewardConfig) -> Verdict | None:
    """`score_one` in this process, or None where it would need math-verify's parser."""
    patterns = dict(re._cache)
    collecting = gc.isenabled()
    gc.disable()  # as in a fork: no collection (and no finaliser's calls) inside the count
    try:
        with without_parser():
            return score_one(text, gold, cfg)
    except NeedsParser:
        return None
    finally:
        re._cache.clear()
        re._cache.update(patterns)
        forget_regex_templates()
        if collecting:
            gc.enable()


def score_item(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    """`score_isolated`'s verdict; in this process where no parser runs (module docstring)."""
    verdict = _score_without_parser(text, gold, cfg)
    return score_isolated(text, gold, cfg) if verdict is None else verdict
