"""A pool of reward worker processes that always finishes its batch.

Why a hand-rolled pool instead of `concurrent.futures.ProcessPoolExecutor`: a worker stuck in
uninterruptible C code (SymPy computing `9^{9^{9^9}}`) must be killed at its deadline, and one
dead worker breaks an executor for good (`BrokenProcessPool`). Here every worker has its own
pipe and one item in flight, so the parent knows which item a dead or hung worker held, gives
that item a verdict ("timeout" or "parse_error"), and starts a replacement.

Limits are in CPU time (the worker's own SIGPROF deadline, then the parent's kill once the
worker has used `timeout_s + kill_grace_s` CPU seconds on the item), so verdicts do not depend
on machine load; `wall_timeout_s` bounds a worker that is blocked or stopped.

Workers use the forkserver (default) or spawn start method: the parent may have JAX loaded,
and forking a process with JAX's threads is unsafe.

Usage:
    with RewardPool(RewardConfig(num_workers=4)) as pool:
        verdicts = pool.score(completions_text, golds)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait

from dynamo_jax.errors import ConfigError
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import precheck, score_one
from dynamo_jax.rewards.user import absolute_spec
from dynamo_jax.rewards.verdict import Verdict, make_verdict
from dynamo_jax.rewards.worker import READY, START_FAILED, worker_main

__all__ = ["RewardPool", "Verdict", "score_one"]

logger = logging.getLogger(__name__)

_PRELOAD_MODULE = "dynamo_jax.rewards.preload"


_HASH_SEED = "0"
# How often an item past its CPU limit in wall time, but not yet in CPU time, is re-checked.
_POLL_S = 0.1
# A worker must import and warm up the parsers within this (seconds; cold spawn ~2-5 s).
_START_TIMEOUT_S = 300.0
# Replacements that die before they are ready, in one `score` call, before giving up.
_MAX_START_FAILURES = 8
# How far into the queue a worker looks for an item of its own group (`next_position`).
_LOOKAHEAD = 64


@dataclasses.dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    born: float = dataclasses.field(default_factory=time.monotonic)
    ready: bool = False


@dataclasses.dataclass
class _InFlight:
    worker: _Worker
    index: int
    start_wall: float
    start_cpu: float | None


def next_position(golds: Sequence[str], own: str | None, claimed: set[str]) -> int:
    """Where in the queue (whose first items have `golds`) a worker takes its next item.

    A worker that reads a group's gold once keeps its server for that gold
    (isolate.GoldServer), so the group's items should go to the same worker: first an item of
    the worker's `own` group (the gold of the last shared item it scored), then one of a group
    no other worker holds (`claimed`: their own golds), else the first item, so that no worker
    waits while there is work. Which worker scores an item never changes its verdict."""
    if own is not None and own in golds:
        return golds.index(own)
    for position, gold in enumerate(golds):
        if gold not in claimed:
            return position
    return 0


@contextlib.contextmanager
def _fixed_hash_seed():
    """Start processes with PYTHONHASHSEED=0 (unless the user set one): SymPy's work on an item
    can depend on set iteration order, and the work budget must count the same calls in every
    run (rewards/budget.py). The forkserver reads the environment once, when it starts."""
    if "PYTHONHASHSEED" in os.environ:
        yield
        return
    os.environ["PYTHONHASHSEED"] = _HASH_SEED
    try:
        yield
    finally:
        os.environ.pop("PYTHONHASHSEED", None)


def _got_ready(worker: _Worker) -> bool:
    """Read a warming worker's first message; True (and marked ready) if it is READY.

    A worker that could not load the user's reward function says why: that is a config error
    (the same in every worker), raised as one line rather than retried.
    """
    try:
        message = worker.conn.recv()
    except (EOFError, OSError):
        message = None
    if isinstance(message, tuple) and message and message[0] == START_FAILED:
        raise ConfigError(str(message[1]))
    worker.ready = message == READY
    return worker.ready


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc; None elsewhere or if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RewardPool:
    """Scores completions in `cfg.num_workers` processes with a per-item deadline.

    One `score` call at a time (not thread-safe). Workers start on `start()` / `with`, or
    lazily on the first `score`.

    `restarts` counts workers replaced after dying or overrunning their deadline.
    """

    def __init__(self, cfg: RewardConfig):
        if cfg.function:
            cfg = dataclasses.replace(cfg, function=absolute_spec(cfg.function))
        self.cfg = cfg
        self._ctx = multiprocessing.get_context(cfg.start_method)
        if cfg.start_method == "forkserver":
            # Effective only if this process has not started its forkserver yet.
            self._ctx.set_forkserver_preload([_PRELOAD_MODULE])
        self._workers: list[_Worker] = []
        self.restarts = 0
        self._closed = False

    def __enter__(self) -> RewardPool:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        """Start the workers and wait until each has warmed up its parsers."""
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        while len(self._workers) < self.cfg.num_workers:
            self._workers.append(self._spawn())
        for worker in self._workers:
            try:
                ready = worker.ready or (worker.conn.poll(_START_TIMEOUT_S) and _got_ready(worker))
            except ConfigError:
                self.close()
                raise
            if not ready:
                raise RuntimeError(
                    f"reward worker {worker.process.pid} did not start "
                    f"(exit code {worker.process.exitcode})"
                )

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main, args=(child_conn, self.cfg), daemon=True, name="reward-worker"
        )
        with _fixed_hash_seed():
            process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill `worker` (if still alive) and put a fresh one in its slot."""
        worker.process.kill()
        worker.process.join(timeout=5)
        worker.conn.close()
        fresh = self._spawn()
        self._workers[self._workers.index(worker)] = fresh
        self.restarts += 1
        return fresh

    def score(
        self,
        completions_text: Sequence[str],
        golds: Sequence[str],
        sources: Sequence[str | None] | None = None,
        extra_infos: Sequence | None = None,
    ) -> list[Verdict]:
        """One verdict per completion, in input order. Never raises for bad completion text.

        `sources` (data_source) and `extra_infos` reach a user's `reward.function` only.
        """
        if len(completions_text) != len(golds):
            raise ValueError(
                f"score: {len(completions_text)} completions but {len(golds)} gold answers"
            )
        sources = [None] * len(golds) if sources is None else list(sources)
        extra_infos = [None] * len(golds) if extra_infos is None else list(extra_infos)
        if not len(sources) == len(extra_infos) == len(golds):
            raise ValueError(
                f"score: {len(golds)} gold answers but {len(sources)} sources and "
                f"{len(extra_infos)} extra_infos"
            )
        for i, gold in enumerate(golds):
            if not isinstance(gold, str):
                raise TypeError(f"score: gold answer {i} must be a str, got {type(gold).__name__}")
        if not self._workers:
            self.start()
        results: list[Verdict | None] = [None] * len(golds)
        pending: collections.deque[int] = collections.deque()
        for i, text in enumerate(completions_text):
            early = precheck(text, self.cfg)  # oversized text never crosses the pipe
            if early is None:
                pending.append(i)
            else:
                results[i] = early
        # Whether a neighbour shares the gold (a group's completions come together): a worker
        # then reads it once for the run of them it gets (isolate.GoldServer), where a lone
        # item is scored in one fork.
        shared = [
            (i > 0 and golds[i - 1] == gold) or (i + 1 < len(golds) and golds[i + 1] == gold)
            for i, gold in enumerate(golds)
        ]
        items = list(zip(completions_text, golds, sources, extra_infos, shared))
        self._run(pending, items, results)
        if self.cfg.function:
            _warn_user_failures(results, self.cfg.function)
        return results  # type: ignore[return-value]

    def _run(self, pending, items, results) -> None:
        """Dispatch loop: one item per ready worker; replacements join once warmed up."""
        batch = _Batch(self, pending, items, results)
        while batch.pending or batch.busy:
            batch.dispatch()
            batch.collect()
            batch.reap_overdue()

    def _next_check(self, job: _InFlight, now: float) -> float:
        """Seconds until `job` could be overdue (re-polled while it waits for the CPU)."""
        wall = now - job.start_wall
        limit = self.cfg.timeout_s + self.cfg.kill_grace_s
        if wall < limit:
            return limit - wall
        return max(0.0, min(_POLL_S, self.cfg.wall_timeout_s - wall))

    def _overdue(self, job: _InFlight, now: float) -> str | None:
        """Why `job`'s worker must be killed now, or None.

        The CPU limit is checked against the worker's CPU time (what it actually computed), so a
        loaded host does not kill honest work; the wall cap catches blocked or stopped workers.
        """
        wall = now - job.start_wall
        if wall >= self.cfg.wall_timeout_s:
            return f"worker killed after {wall:.1f} s wall-clock"
        limit = self.cfg.timeout_s + self.cfg.kill_grace_s
        if wall < limit:
            return None
        cpu = _cpu_seconds(job.worker.process.pid)
        used = wall if cpu is None or job.start_cpu is None else cpu - job.start_cpu
        return f"worker killed after {used:.1f} CPU s" if used >= limit else None

    def close(self) -> None:
        """Stop all workers (politely, then by force). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.conn.close()
        self._workers = []


def _warn_user_failures(results: list[Verdict], spec: str) -> None:
    """One warning per batch in which the user's reward function raised, returned junk or hung:
    those items still get a verdict, and the run goes on, but not silently."""
    failed = [v for v in results if v.status in ("parse_error", "timeout")]
    if failed:
        logger.warning(
            "reward.function %s: %d of %d completions got no score (%s: %s)",
            spec,
            len(failed),
            len(results),
            failed[0].status,
            failed[0].detail,
        )


class _Batch:
    """The state of one `score` call: idle, warming and busy workers, and the results."""

    def __init__(self, pool: RewardPool, pending, items, results):
        self.pool, self.cfg = pool, pool.cfg
        self.pending, self.items, self.results = pending, items, results
        self.idle = [w for w in pool._workers if w.ready]
        self.warming = {id(w.conn): w for w in pool._workers if not w.ready}  # by id(conn)
        self.busy: dict[int, _InFlight] = {}  # by id(conn)
        self.start_failures = 0
        self.group_of: dict[int, str] = {}  # by id(conn): the gold of its last shared item

    def _take(self, worker: _Worker) -> int:
        """The next item for `worker`, its group's first (`next_position`)."""
        key = id(worker.conn)
        window = [self.items[index][1] for index in itertools.islice(self.pending, _LOOKAHEAD)]
        claimed = {gold for other, gold in self.group_of.items() if other != key}
        position = next_position(window, self.group_of.get(key), claimed)
        self.pending.rotate(-position)
        index = self.pending.popleft()
        self.pending.rotate(position)
        if self.items[index][4]:  # shared: the worker's gold server now holds this gold
            self.group_of[key] = self.items[index][1]
        return index

    def replace(self, worker: _Worker) -> None:
        self.group_of.pop(id(worker.conn), None)  # its gold server died with it
        fresh = self.pool._replace(worker)
        self.warming[id(fresh.conn)] = fresh

    def dispatch(self) -> None:
        while self.pending and self.idle:
            worker = self.idle.pop()
            index = self._take(worker)
            try:
                worker.conn.send((index, *self.items[index]))
            except (BrokenPipeError, OSError):  # died while idle: retry on a fresh one
                self.replace(worker)
                self.pending.appendleft(index)
                continue
            cpu = _cpu_seconds(worker.process.pid)
            self.busy[id(worker.conn)] = _InFlight(worker, index, time.monotonic(), cpu)

    def collect(self) -> None:
        """Wait for the next answer, death, ready signal or deadline check, and handle them."""
        now = time.monotonic()
        waits = [self.pool._next_check(job, now) for job in self.busy.values()]
        conns = [job.worker.conn for job in self.busy.values()]
        if self.pending:  # only then is it worth waiting for a warming worker
            waits += [max(0.0, w.born + _START_TIMEOUT_S - now) for w in self.warming.values()]
            conns += [w.conn for w in self.warming.values()]
        for conn in wait(conns, timeout=min(waits)):
            if id(conn) in self.warming:
                self._on_ready(self.warming.pop(id(conn)))
                continue
            job = self.busy.pop(id(conn))
            try:
                _, verdict = conn.recv()
            except (EOFError, OSError):
                job.worker.process.join(timeout=1.0)  # reap it, so its exit code is known
                code = job.worker.process.exitcode
                # -9: SIGKILL, what the kernel's OOM killer sends (its log names the victim)
                why = " (SIGKILL: the OOM killer or kill -9)" if code == -9 else ""
                self.results[job.index] = make_verdict(
                    "parse_error", self.cfg, detail=f"reward worker died (exit code {code}){why}"
                )
                self.replace(job.worker)
                continue
            self.results[job.index] = verdict
            self.idle.append(job.worker)

    def _on_ready(self, worker: _Worker) -> None:
        if _got_ready(worker):
            self.idle.append(worker)
            return
        self.start_failures += 1
        if self.start_failures > _MAX_START_FAILURES:
            raise RuntimeError("reward workers keep dying during start-up")
        self.replace(worker)

    def reap_overdue(self) -> None:
        """Kill and replace workers past their item's deadline (or stuck starting up)."""
        now = time.monotonic()
        for key, job in list(self.busy.items()):
            reason = self.pool._overdue(job, now)
            if reason is not None:
                del self.busy[key]
                self.results[job.index] = make_verdict("timeout", self.cfg, detail=reason)
                self.replace(job.worker)
        for key, worker in list(self.warming.items()):
            if now - worker.born > _START_TIMEOUT_S:
                del self.warming[key]
                self.replace(worker)
