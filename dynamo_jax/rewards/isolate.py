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
import functools
import gc
import math
import os
import pickle
import re
import resource
import signal
import struct

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.gold import prepare_gold
from dynamo_jax.rewards.math_check import (
    NeedsParser,
    forget_regex_templates,
    score_one,
    without_parser,
)
from dynamo_jax.rewards.verdict import Verdict, make_verdict

_PR_SET_PDEATHSIG = 1


def available() -> bool:
    return hasattr(os, "fork")


def _load_prctl():
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None


# Loaded once here, not in each child: opening libc took ~0.5 of a child's ~3 CPU ms.
_PRCTL = _load_prctl()


def _die_with_parent() -> None:
    if _PRCTL is not None:
        with contextlib.suppress(OSError, TypeError):
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _child(write_fd: int, function, args, cpu_limit: int) -> None:
    gc.disable()
    _die_with_parent()
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 1))
    data = pickle.dumps(function(*args))
    with os.fdopen(write_fd, "wb") as out:
        out.write(data)


def _fork(run, *close: int) -> int:
    """Fork; the child closes the descriptors `close`, runs `run()` and leaves without running
    the parent's cleanup (exit status 1 where it raised). The child's pid, to the parent."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for fd in close:
                os.close(fd)
            run()
        except BaseException:  # noqa: BLE001 - seen by the parent as a dead child
            code = 1
        finally:
            os._exit(code)
    return pid


def _fork_call(function, args, cpu_limit: int) -> tuple[bytes, int]:
    """(pickled result or b"", wait status) of `function(*args)` run in a forked child."""
    read_fd, write_fd = os.pipe()
    pid = _fork(functools.partial(_child, write_fd, function, args, cpu_limit), read_fd)
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


def _cpu_limit(cfg: RewardConfig) -> int:
    return math.ceil(cfg.timeout_s + cfg.kill_grace_s)


def score_isolated(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    """`score_one(text, gold, cfg)` in a forked child of this process (see module docstring)."""
    return _verdict(*_fork_call(score_one, (text, gold, cfg), _cpu_limit(cfg)), cfg)


def _verdict(data: bytes, status: int, cfg: RewardConfig) -> Verdict:
    """The verdict a scoring child sent, or the one its death means."""
    cpu_limit = _cpu_limit(cfg)
    if data:
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 - a truncated write from a child killed mid-way
            pass
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
        return make_verdict("timeout", cfg, detail=f"killed at the {cpu_limit} CPU s limit")
    return make_verdict("parse_error", cfg, detail=f"scoring process died (status {status})")


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


_REQUEST = struct.Struct("!I")  # the pickled call's length
_RESULT = struct.Struct("!iI")  # the item's wait status, its pickled result's length


class GoldServer:
    """A fork of this (warm) process that has parsed one gold (gold.prepare_gold) and forks each
    item of that gold from there: the gold's parse is paid once per run of items sharing it,
    and every item still starts from the same state (its count and verdict are those of
    `score_isolated`). It holds the CPU limit of an item while it parses, and dies with this
    process."""

    def __init__(self, gold: str, cfg: RewardConfig):
        self.gold, self.cfg, self.status = gold, cfg, None
        requests_read, requests_write = os.pipe()
        results_read, results_write = os.pipe()
        serve = functools.partial(_serve, gold, cfg, requests_read, results_write)
        pid = _fork(serve, requests_write, results_read)
        os.close(requests_read)
        os.close(results_write)
        self.pid = pid
        self._requests = os.fdopen(requests_write, "wb")
        self._results = os.fdopen(results_read, "rb")

    def call(self, function, *args) -> tuple[bytes, int] | None:
        """(pickled result or b"", wait status) of `function(*args, prepared=<the gold>)` in a
        fork of the server; None where the server itself died (its wait status: `status`)."""
        payload = pickle.dumps((function, args))
        try:
            self._requests.write(_REQUEST.pack(len(payload)) + payload)
            self._requests.flush()
            header = self._results.read(_RESULT.size)
            status, size = _RESULT.unpack(header)
            data = self._results.read(size)
            if len(data) == size:
                return data, status
        except (OSError, struct.error):  # a closed pipe, or a short header: the server died
            pass
        self.close()
        return None

    def close(self) -> None:
        if self.status is None:
            with contextlib.suppress(OSError):
                self._requests.close()
            self._results.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.status = os.waitpid(self.pid, 0)[1]


def _serve(gold: str, cfg: RewardConfig, requests_fd: int, results_fd: int) -> None:
    gc.disable()
    _die_with_parent()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (_cpu_limit(cfg), hard))
    prepared = prepare_gold(gold, cfg)
    with contextlib.suppress(ValueError, OSError):  # its items carry their own limits
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    with os.fdopen(requests_fd, "rb") as requests, os.fdopen(results_fd, "wb") as results:
        while len(header := requests.read(_REQUEST.size)) == _REQUEST.size:
            function, args = pickle.loads(requests.read(_REQUEST.unpack(header)[0]))
            call = functools.partial(function, prepared=prepared)
            data, status = _fork_call(call, args, _cpu_limit(cfg))
            results.write(_RESULT.pack(status, len(data)) + data)
            results.flush()


class _Current:
    server: GoldServer | None = None  # this process's server for the gold of its last item


def score_with_gold(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    """`score_isolated(text, gold, cfg)`'s verdict, from this process's server for `gold`."""
    server = _Current.server
    if server is not None and (server.gold, server.cfg, server.status) != (gold, cfg, None):
        server.close()
        server = None
    if server is None:
        server = _Current.server = GoldServer(gold, cfg)
    result = server.call(score_one, text, gold, cfg)
    if result is None:  # the server died: killed at its CPU limit parsing the gold, or worse
        _Current.server = None
        return _verdict(b"", server.status, cfg)
    return _verdict(*result, cfg)


def close_gold_server() -> None:
    if _Current.server is not None:
        _Current.server.close()
        _Current.server = None


def score_item(text: str, gold: str, cfg: RewardConfig, gold_shared: bool = False) -> Verdict:
    """`score_isolated`'s verdict; in this process where no parser runs (module docstring), else
    (math mode) from the server of its gold where that gold is shared with other items or
    already served (a server costs one more fork, paid back from its second item)."""
    verdict = _score_without_parser(text, gold, cfg)
    if verdict is not None:
        return verdict
    served = _Current.server is not None and _Current.server.gold == gold
    if cfg.answer_format == "math" and (gold_shared or served):
        return score_with_gold(text, gold, cfg)
    return score_isolated(text, gold, cfg)
