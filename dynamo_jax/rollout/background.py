"""`BackgroundEngine`: a rollout engine whose generation runs while the trainer trains.

The vLLM sidecar is another process, so the trainer only has to wait on its socket; doing that
on a worker thread lets the main thread score, compute log-probs and update meanwhile
(rollout/pipeline.py decides what to request when). Every engine call goes to ONE worker thread
in call order, so the engine never sees two calls at once (the sidecar client is not meant to be
shared between threads: its restart logic and weight version are per-call state) and a weight
push queued after a generate loads only once that generate has finished.

Multi-process runs: collectives must be issued by every process in the same order, which only
the main thread's loop guarantees. Engines therefore split each call (`BackgroundCapable`):
- generate = `generate_local` (this process's share, no collective: on the worker) +
  `finish_generate` (e.g. the all-gather of every process's completions: on the main thread,
  when the trainer takes the batch);
- update_weights = `export_weights` (reads the parameters, gathering shards collectively: on
  the main thread, before the next update donates them) + `load_weights` (the sidecar's reload:
  on the worker, queued behind the generation in flight).
So the trainer never waits for a push, nor for a generation it does not need yet.

The embedded JAX engine shares the trainer's devices and runs collectively on the global mesh,
so it is not wrapped: rollout/pipeline.py generates its lagged batches synchronously.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams


@runtime_checkable
class BackgroundCapable(Protocol):
    """An engine whose calls split into a process-local part and a collective part."""

    def generate_local(self, requests: Sequence[Request], sampling: SamplingParams) -> Any:
        """This process's share of `generate`; touches only this process's engine."""
        ...

    def finish_generate(self, requests: Sequence[Request], local: Any) -> list[Completion]:
        """The rest of `generate` (collectives allowed): every completion, in request order."""
        ...

    def export_weights(self, params: Any, version: int) -> Any:
        """The part of `update_weights` that reads `params` (collectives allowed)."""
        ...

    def load_weights(self, exported: Any) -> None:
        """The rest of `update_weights`: process-local."""
        ...

    @property
    def weight_version(self) -> int: ...

    def close(self) -> None: ...


class Pending:
    """A generation submitted to the worker; `result()` (main thread) waits and finishes it."""

    def __init__(self, owner: BackgroundEngine, requests: list[Request], future: Future):
        self._owner, self._requests, self._future = owner, requests, future
        self._completions: list[Completion] | None = None

    def done(self) -> bool:
        return self._completions is not None or self._future.done()

    @property
    def generate_s(self) -> float:
        """Seconds the worker spent generating (valid once done)."""
        return self._future.result()[1]

    def result(self) -> list[Completion]:
        """The completions; the first call waits for the worker and runs `finish_generate`
        (a collective on several processes: every process calls this at the same point)."""
        if self._completions is None:
            local, _ = self._future.result()
            self._owner.raise_failed_pushes()
            self._completions = self._owner.engine.finish_generate(self._requests, local)
        return self._completions


def _timed_call(fn, *args) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


class BackgroundEngine:
    """A `RolloutEngine` over a `BackgroundCapable` engine, all engine work on one worker thread.

    `submit` returns at once; `generate` is `submit(...).result()` (evaluation uses it: it runs
    after everything queued before it, so it sees the last pushed weights). `update_weights`
    exports on the caller's thread and queues the load; `weight_version` is the version of the
    last push queued, i.e. the weights every later generate runs with. A push that failed on
    the worker is raised by the next `result()`, `update_weights` or `close`.
    """

    def __init__(self, engine: BackgroundCapable):
        if not isinstance(engine, BackgroundCapable):
            raise TypeError(f"{type(engine).__name__} cannot generate in the background")
        self.engine = engine
        self._version = int(engine.weight_version)
        self._pushes: list[Future] = []
        self._worker: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rollout-engine"
        )

    @property
    def weight_version(self) -> int:
        return self._version

    def submit(self, requests: Sequence[Request], sampling: SamplingParams) -> Pending:
        requests = list(requests)
        future = self._open().submit(_timed_call, self.engine.generate_local, requests, sampling)
        return Pending(self, requests, future)

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Completion]:
        return self.submit(requests, sampling).result()

    def update_weights(self, params: Any, version: int) -> None:
        worker = self._open()
        self.raise_failed_pushes()
        exported = self.engine.export_weights(params, version)
        self._pushes.append(worker.submit(self.engine.load_weights, exported))
        self._version = int(version)

    def raise_failed_pushes(self) -> None:
        """Re-raise the error of a finished push, if any (and forget finished ones)."""
        done = [f for f in self._pushes if f.done()]
        self._pushes = [f for f in self._pushes if not f.done()]
        for future in done:
            future.result()

    def close(self) -> None:
        """Finish the call in progress (queued ones are cancelled), then close the engine."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)
            self._worker = None
        self.engine.close()

    def _open(self) -> ThreadPoolExecutor:
        if self._worker is None:
            raise RuntimeError("the background rollout engine is closed")
        return self._worker
