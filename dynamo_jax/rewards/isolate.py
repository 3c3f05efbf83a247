"""Score each item in a fresh fork of the warm worker: the same process state for every item.

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
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import pickle
import resource
import signal

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import make_verdict, score_one
from dynamo_jax.rewards.verdict import Verdict

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
