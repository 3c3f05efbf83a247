"""Shape bucketing and request expansion for the embedded rollout engine.

Every distinct (batch, prompt length, generation length) is a separate XLA program, and a
training run sees a different total sample count and longest prompt at every step. Rounding each
up to a power of two (with a floor) bounds the number of programs by
log2(max/min) per dimension, at the cost of at most 2x padding; rows are also split into batches
of at most `max_batch` so memory stays bounded however many samples a step asks for.

Rows are laid out in a canonical order, sorted by (prompt length, prompt id, sample index), not
in request order: the same set of requests then produces the same device batches whatever order
the caller listed them in, and grouping similar lengths wastes less padding when a call is split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dynamo_jax.rollout.protocol import Request


def pow2_bucket(n: int, minimum: int, multiple_of: int = 1) -> int:
    """Smallest power of two >= max(n, minimum), rounded up to a multiple of `multiple_of`."""
    if n < 1 or minimum < 1 or multiple_of < 1:
        raise ValueError(
            f"pow2_bucket needs positive sizes, got n={n} minimum={minimum} multiple_of={multiple_of}"
        )
    size = 1 << (max(n, minimum) - 1).bit_length()
    return -(-size // multiple_of) * multiple_of


@dataclasses.dataclass(frozen=True)
class Row:
    """One sample to draw: a request's prompt and the sample's index within the request."""

    request_index: int
    prompt_id: int
    sample_index: int
    prompt: tuple[int, ...]


def expand_requests(requests: Sequence[Request], vocab_size: int) -> list[Row]:
    """One `Row` per sample, in canonical order; validates ids so bad input fails early.

    Raises ValueError for a prompt id that appears twice (its samples would share random keys
    and be identical copies) and for token ids outside [0, vocab_size).
    """
    seen: dict[int, int] = {}
    rows = []
    for i, req in enumerate(requests):
        if req.prompt_id in seen:
            raise ValueError(
                f"requests[{i}] repeats prompt_id {req.prompt_id} (also requests[{seen[req.prompt_id]}]); "
                "samples are keyed by (seed, prompt_id, sample_index), so merge them into one "
                "request with the summed n"
            )
        seen[req.prompt_id] = i
        bad = [t for t in req.prompt_token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"requests[{i}] (prompt_id {req.prompt_id}) has token ids outside the "
                f"vocabulary [0, {vocab_size}): {bad[:5]}"
            )
        rows.extend(Row(i, req.prompt_id, j, req.prompt_token_ids) for j in range(req.n))
    rows.sort(key=lambda r: (len(r.prompt), r.prompt_id, r.sample_index))
    return rows


def split_rows(rows: Sequence[Row], max_batch: int) -> list[list[Row]]:
    """Consecutive groups of at most `max_batch` rows (rows are already length-sorted)."""
    return [list(rows[i : i + max_batch]) for i in range(0, len(rows), max_batch)]


def distinct_prompts(rows: Sequence[Row]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct prompts of `rows` in first-appearance order, and each row's index into them.

    Keyed by prompt id (`expand_requests` makes ids unique per call), so two requests with equal
    token ids are still two prompts: their rows would share a prefill result either way.
    """
    index: dict[int, int] = {}
    prompts: list[tuple[int, ...]] = []
    of_row = []
    for row in rows:
        if row.prompt_id not in index:
            index[row.prompt_id] = len(prompts)
            prompts.append(row.prompt)
        of_row.append(index[row.prompt_id])
    return prompts, of_row


def left_pad(
    prompts: Sequence[Sequence[int]], batch: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded int32 tokens and mask [batch, length].

    Filler rows (beyond len(prompts)) get a single real token 0 in the last slot, so no row is
    fully masked: the model then never normalises over an empty key set.
    """
    tokens_BxP = np.zeros((batch, length), np.int32)
    mask_BxP = np.zeros((batch, length), np.int32)
    for b, prompt in enumerate(prompts):
        if len(prompt) > length:
            raise ValueError(f"prompt of length {len(prompt)} exceeds its bucket {length}")
        tokens_BxP[b, length - len(prompt) :] = prompt
        mask_BxP[b, length - len(prompt) :] = 1
    mask_BxP[len(prompts) :, -1] = 1
    return tokens_BxP, mask_BxP
