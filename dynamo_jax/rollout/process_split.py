"""A step's rollouts split across every engine of every process: one mechanism for both levels.

A run has `P` processes (one per host) and each process `S` local engines (vLLM sidecars, one per
device group of its host). `SplitEngine` wraps one process's local engines:

- generate: the requests are cut into `P * S` contiguous slices (`request_slice`), balanced by
  sample count and never splitting a request (a prompt's group stays on one engine); local
  engine s of process p samples slice `p * S + s`, all local engines at once. A process's
  slices are adjacent, so its completions are one contiguous run of the batch; with several
  processes they are all-gathered, so every process returns the whole batch in request order.
  Sampling randomness is keyed by (seed, prompt_id, sample_index) (rollout/protocol.py), so
  which engine drew a sample does not change it.
- update_weights: the parameters are exported ONCE per process (host) into one shared
  directory (every process at the same time: the gather of sharded parameters is collective);
  every local engine reloads it and verifies it (`load_push`), then the previous push is deleted.
  Engines without `load_push` (e.g. a test's) are given the parameters directly.

Completions travel as plain arrays (lengths, finish codes, token ids, log-probs, versions); prompt
ids are not sent: every process knows the requests, so they are rebuilt from the request order
(and int64 hash ids would not survive JAX's 32-bit all-gather anyway).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams
from dynamo_jax.rollout.weight_push import PushTimings
from dynamo_jax.sharding import multihost

_FINISH = ("stop", "length")


def request_slice(requests: Sequence[Request], index: int, count: int) -> slice:
    """The contiguous requests process `index` of `count` generates.

    Request r goes to the process whose equal share of the total sample count contains r's
    first sample, so slices are balanced to within one request and cover every request once.
    """
    starts = np.cumsum([0] + [r.n for r in requests])[:-1]
    total = sum(r.n for r in requests)
    # Non-decreasing; a trailing request with n = 0 starts at `total`: it goes to the last.
    owner = np.minimum((starts * count) // max(total, 1), count - 1)
    lo, hi = np.searchsorted(owner, index, "left"), np.searchsorted(owner, index, "right")
    return slice(int(lo), int(hi))


def _pack(completions: Sequence[Completion]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int32 [n, 3] (length, finish code, weight version), int32 [T] tokens, float32 [T] logprobs."""
    meta = np.asarray(
        [(len(c.token_ids), _FINISH.index(c.finish_reason), c.weight_version) for c in completions],
        np.int32,
    ).reshape(-1, 3)
    tokens = [np.asarray(c.token_ids, np.int32) for c in completions]
    logprobs = [np.asarray(c.logprobs, np.float32) for c in completions]
    cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt)
    return meta, cat(tokens, np.int32), cat(logprobs, np.float32)


def _gather_padded(x: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Every process's `x` (leading axes of different lengths `sizes`), in process order."""
    width = max(int(sizes.max()), 1)
    padded = np.zeros((width, *x.shape[1:]), x.dtype)
    padded[: len(x)] = x
    stacked = multihost.allgather_host(padded)
    return [stacked[p, : int(n)] for p, n in enumerate(sizes)]


def gather_completions(local: Sequence[Completion], requests: Sequence[Request]) -> list:
    """All processes' completions of `requests` (each process passes its own slice's), in
    request order. Call on EVERY process."""
    meta, tokens, logprobs = _pack(local)
    sizes = multihost.allgather_host(np.asarray([len(meta), len(tokens)], np.int32))
    metas = np.concatenate(_gather_padded(meta, sizes[:, 0]))
    all_tokens = np.concatenate(_gather_padded(tokens, sizes[:, 1]))
    all_logprobs = np.concatenate(_gather_padded(logprobs, sizes[:, 1]))
    if len(metas) != sum(r.n for r in requests):
        raise RuntimeError(
            f"process split: gathered {len(metas)} completions for {sum(r.n for r in requests)} "
            "requested samples"
        )
    out, offset, row = [], 0, 0
    for request in requests:
        for index in range(request.n):
            length, finish, version = (int(v) for v in metas[row])
            out.append(
                Completion(
                    prompt_id=request.prompt_id,
                    sample_index=index,
                    token_ids=all_tokens[offset : offset + length],
                    logprobs=all_logprobs[offset : offset + length],
                    finish_reason=_FINISH[finish],
                    weight_version=version,
                )
            )
            offset, row = offset + length, row + 1
    return out


def _run_each(fn: Callable, items: Sequence) -> list:
    """fn(item) for every item, concurrently when there are several (each a blocking call into
    its own sidecar); the first failure is raised after all have finished."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        concurrent.futures.wait(futures)
    return [f.result() for f in futures]


class SplitEngine:
    """A `RolloutEngine` over this process's `local` engines (see the module docstring).

    Every method must be called on every process at the same time with the same arguments
    (the trainer's host loop does that). `export(params, version) -> PushDir` writes one push
    for the host (weight_push.export_push_dir); without it each local engine is given the
    parameters itself. `last_local_samples` is how many samples this process's engines drew in
    the last `generate`, `last_samples` how many each did; `exports` counts exports, `last_push`
    has the last push's timings. The process index and count default to JAX's.
    """

    def __init__(
        self,
        local: Sequence[Any],
        export: Callable | None = None,
        *,
        process_index: int | None = None,
        process_count: int | None = None,
    ):
        if not local:
            raise ValueError("SplitEngine needs at least one local engine")
        self.local = list(local)
        self.export = export
        self.process_index = jax.process_index() if process_index is None else process_index
        self.process_count = jax.process_count() if process_count is None else process_count
        self.last_local_samples = 0
        self.last_samples = [0] * len(self.local)
        self.exports = 0
        self.last_push = None
        self._push = None  # the host's current push, deleted when the next one is loaded
        self._version = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def slices(self, requests: Sequence[Request]) -> list[slice]:
        """The slice of `requests` each local engine samples."""
        count = self.process_count * len(self.local)
        first = self.process_index * len(self.local)
        return [request_slice(requests, first + s, count) for s in range(len(self.local))]

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Completion]:
        return self.finish_generate(requests, self.generate_local(requests, sampling))

    def update_weights(self, params: Any, version: int) -> None:
        if self.export is None:  # each local engine is given the parameters itself
            if version < self._version:
                raise ValueError(
                    f"weight version must not go back: {version} after {self._version}"
                )
            _run_each(lambda engine: engine.update_weights(params, version), self.local)
            self._version = version
            return
        self.load_weights(self.export_weights(params, version))

    # -- the two halves of a call, for rollout/background.py (generation beside training) ------
    def generate_local(self, requests: Sequence[Request], sampling: SamplingParams) -> list:
        """This process's slices, from its own engines (no collective)."""
        parts = [list(requests[s]) for s in self.slices(requests)]
        wants = [sum(r.n for r in part) for part in parts]
        # An engine whose slice asks for no samples (none, or only n = 0 requests) is not called.
        jobs = [(engine, part) for engine, part, want in zip(self.local, parts, wants) if want]
        outs = iter(_run_each(lambda job: job[0].generate(job[1], sampling), jobs))
        local = []
        for s, want in enumerate(wants):
            got = next(outs) if want else []
            if len(got) != want:
                raise RuntimeError(
                    f"process {self.process_index}: local engine {s} returned {len(got)} "
                    f"completions for {want} samples"
                )
            self.last_samples[s] = want
            local.extend(got)
        self.last_local_samples = len(local)
        return local

    def finish_generate(self, requests: Sequence[Request], local: list) -> list[Completion]:
        """Every process's slices in request order (an all-gather: call on every process)."""
        if self.process_count == 1:
            return local
        return gather_completions(local, requests)

    def export_weights(self, params: Any, version: int) -> Any:
        """The part of a push that reads `params` (collective on several processes): the host's
        push directory, or without `export` each local engine's own export."""
        if version < self._version:
            raise ValueError(f"weight version must not go back: {version} after {self._version}")
        if self.export is None:
            return version, [engine.export_weights(params, version) for engine in self.local]
        push = self.export(params, version)  # once for the host
        self.exports += 1
        return version, push

    def load_weights(self, exported: Any) -> None:
        """Every local engine loads an `export_weights` result (process-local)."""
        version, push = exported
        if self.export is None:
            _run_each(lambda pair: pair[0].load_weights(pair[1]), list(zip(self.local, push)))
            self._version = version
            return
        try:
            timings = _run_each(lambda engine: engine.load_push(push), self.local)
        except BaseException:
            # Engines that loaded it would restart from it, but the run ends on this error.
            push.remove()
            raise
        old, self._push, self._version = self._push, push, version
        if old is not None:
            old.remove()
        reload_s, verify_s = (max(t[i] for t in timings) for i in (0, 1))
        self.last_push = PushTimings(push.export_s, reload_s, push.nbytes, verify_s)

    def close(self) -> None:
        try:
            _run_each(lambda engine: engine.close(), self.local)
        finally:
            if self._push is not None:
                self._push.remove()
                self._push = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
