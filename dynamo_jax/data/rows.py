"""A dataset row and its stable prompt id.

The prompt id keys everything that follows a prompt across steps: the allocators' per-prompt
history (G_i, k_i, ranks), GRPO groups, checkpoints. It must therefore not depend on row order
(reshuffling, resuming, appending files) and must be unique within a run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

# Ids are positive int64 so they fit NumPy/JAX int64 arrays and JSON without loss.
_ID_MASK = (1 << 63) - 1

Message = dict[str, str]
ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class Row:
    """One problem. `index` is the dense position 0..N-1 in the loaded dataset; `prompt_id` the
    stable id; `rank` the optional difficulty prior in [0, 1] (verl `rank` column, used by E3)."""

    prompt_id: int
    index: int
    messages: tuple[Message, ...]
    gold: str
    source: str
    rank: float | None = None
    # Where the row was read ("data/train.parquet row 12"), for errors found after loading;
    # not part of the row's identity.
    origin: str = dataclasses.field(default="", compare=False)


def hash_id(*parts: str) -> int:
    """A 63-bit id from the parts (blake2b: stable across processes and Python versions,
    unlike `hash()`)."""
    digest = hashlib.blake2b("\x00".join(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _ID_MASK


def content_id(source: str, messages: tuple[Message, ...], gold: str, occurrence: int) -> int:
    """Id of a row without an id field: a hash of source + prompt + gold answer.

    The gold is hashed in because the training parquet repeats 133 prompts, 15 of them with
    different answers: those must be different prompts for the allocator, whatever their order
    in the file. Exact repeats (same source, prompt and answer) are interchangeable; the k-th
    one hashes k in too, so ids stay unique.
    """
    prompt = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
    if occurrence == 0:
        return hash_id(source, prompt, gold)
    return hash_id(source, prompt, gold, f"#{occurrence}")


def explicit_id(value) -> int:
    """Id from an id column: non-negative ints are used as they are, strings are hashed."""
    if isinstance(value, bool):
        raise TypeError("must be an int or str, got bool")
    if isinstance(value, int):
        if not 0 <= value <= _ID_MASK:
            raise ValueError(f"int id {value} is outside [0, 2**63)")
        return value
    if isinstance(value, str) and value:
        try:
            return hash_id("id", value)
        except UnicodeEncodeError:
            raise ValueError(f"str id {value!r} is not valid Unicode (a lone surrogate)") from None
    raise TypeError(f"must be a non-negative int or non-empty str, got {value!r}")
