"""One rollout engine per process, each generating its slice of a step's requests.

In a multi-process run every process holds the whole rollout batch (docs/scaling.md), but a vLLM
sidecar serves only its own host's GPUs. `ProcessSplitEngine` wraps each process's local engine:

- generate: the requests are cut into one contiguous slice per process, balanced by sample
  count and never splitting a request (a prompt's group stays on one host); each process's local
  engine samples its slice, and the completions are all-gathered, so every process returns the
  whole batch in request order. Sampling randomness is keyed by (seed, prompt_id, sample_index)
  (rollout/protocol.py), so which host drew a sample does not change it.
- update_weights: every process exports the parameters (the gather is collective) into its own
  host's shared memory and loads them into its own sidecar.

Completions travel as plain arrays (lengths, finish codes, token ids, log-probs, versions); prompt
ids are not sent: every process knows the requests, so they are rebuilt from the request order
(and int64 hash ids would not survive JAX's 32-bit all-gather anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams
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


class ProcessSplitEngine:
    """A `RolloutEngine` over one local engine per process (see the module docstring).

    Every method must be called on every process at the same time with the same arguments
    (the trainer's host loop does that); `last_local_samples` is how many samples this
    process's own engine drew in the last `generate`.
    """

    def __init__(self, local: Any):
        self.local = local
        self.last_local_samples = 0

    @property
    def weight_version(self) -> int:
        return self.local.weight_version

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Completion]:
        return self.finish_generate(requests, self.generate_local(requests, sampling))

    def update_weights(self, params: Any, version: int) -> None:
        self.local.update_weights(params, version)

    # -- the two halves of a call, for rollout/background.py (generation beside training) ------
    def generate_local(self, requests: Sequence[Request], sampling: SamplingParams) -> list:
        """This process's slice, from its own engine (no collective)."""
        mine = list(requests[request_slice(requests, jax.process_index(), jax.process_count())])
        local = self.local.generate(mine, sampling) if mine else []
        self.last_local_samples = len(local)
        if len(local) != sum(r.n for r in mine):
            raise RuntimeError(
                f"process {jax.process_index()}: local engine returned {len(local)} completions "
                f"for {sum(r.n for r in mine)} samples"
            )
        return local

    def finish_generate(self, requests: Sequence[Request], local: list) -> list[Completion]:
        """Every process's slice, all-gathered (a collective: call on every process)."""
        return gather_completions(local, requests)

    def export_weights(self, params: Any, version: int) -> Any:
        return self.local.export_weights(params, version)

    def load_weights(self, exported: Any) -> None:
        self.local.load_weights(exported)

    def close(self) -> None:
        self.local.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
