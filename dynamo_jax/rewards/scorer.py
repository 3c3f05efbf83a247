"""A pool of reward worker processes that always finishes its batch.

Why a hand-rolled pool instead of `concurrent.futures.ProcessPoolExecutor`: a worker stuck in
uninterruptible C code (SymPy computing `9^{9^{9^9}}`) must be killed at its deadline, and one
dead worker breaks an executor for good (`BrokenProcessPool`). Here every worker has its own
pipe and one item in flight, so the parent knows which item a dead or hung worker held, gives
that item a verdict ("timeout" or "parse_error"), and starts a replacement.

Workers use the forkserver (default) or spawn start method: the parent may have JAX loaded,
and forking a process with JAX's threads is unsafe.

Usage:
    with RewardPool(RewardConfig(num_workers=4)) as pool:
        verdicts = pool.score(completions_text, golds)
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import make_verdict, precheck, score_one
from dynamo_jax.rewards.verdict import Verdict
from dynamo_jax.rewards.worker import worker_main

__all__ = ["RewardPool", "Verdict", "score_one"]

_PRELOAD_MODULE = "dynamo_jax.rewards.preload"


@dataclasses.dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection


class RewardPool:
    """Scores completions in `cfg.num_workers` processes with a per-item deadline.

    `restarts` counts workers replaced after dying or overrunning their deadline.
    """

    def __init__(self, cfg: RewardConfig):
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
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        while len(self._workers) < self.cfg.num_workers:
            self._workers.append(self._spawn())

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main, args=(child_conn, self.cfg), daemon=True, name="reward-worker"
        )
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

    def score(self, completions_text: Sequence[str], golds: Sequence[str]) -> list[Verdict]:
        """One verdict per completion, in input order. Never raises for bad completion text."""
        if len(completions_text) != len(golds):
            raise ValueError(
                f"score: {len(completions_text)} completions but {len(golds)} gold answers"
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
        self._run(pending, completions_text, golds, results)
        return results  # type: ignore[return-value]

    def _run(self, pending, texts, golds, results) -> None:
        cfg = self.cfg
        idle = list(self._workers)
        busy: dict[int, tuple[_Worker, int, float]] = {}  # keyed by id(conn)
        while pending or busy:
            while pending and idle:
                worker, index = idle.pop(), pending.popleft()
                try:
                    worker.conn.send((index, texts[index], golds[index]))
                except (BrokenPipeError, OSError):  # died while idle: retry on a fresh one
                    idle.append(self._replace(worker))
                    pending.appendleft(index)
                    continue
                deadline = time.monotonic() + cfg.timeout_s + cfg.kill_grace_s
                busy[id(worker.conn)] = (worker, index, deadline)
            wait_s = max(0.0, min(d for _, _, d in busy.values()) - time.monotonic())
            for conn in wait([w.conn for w, _, _ in busy.values()], timeout=wait_s):
                worker, index, _ = busy.pop(id(conn))
                try:
                    _, verdict = conn.recv()
                except (EOFError, OSError):
                    code = worker.process.exitcode
                    results[index] = make_verdict(
                        "parse_error", cfg, detail=f"reward worker died (exit code {code})"
                    )
                    idle.append(self._replace(worker))
                    continue
                results[index] = verdict
                idle.append(worker)
            now = time.monotonic()
            for key, (worker, index, deadline) in list(busy.items()):
                if now >= deadline:
                    del busy[key]
                    results[index] = make_verdict(
                        "timeout",
                        cfg,
                        detail=f"worker killed after {cfg.timeout_s + cfg.kill_grace_s} s",
                    )
                    idle.append(self._replace(worker))

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
