"""Wire format between the trainer and the vLLM sidecar (stdlib only).

Both sides import this file: the trainer as `dynamo_jax.rollout.wire`, the sidecar by path (the
vLLM venv does not have dynamo_jax installed), so it must never import anything outside the
standard library.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. JSON keeps the
format readable in logs and is exact for what travels here: token ids are ints, and Python's
float repr round-trips float64 (log-probs arrive at the engine's float32 precision, unchanged).
Weights never travel in-band: they go through a safetensors file on shared memory.

Every connection starts with `{"op": "hello", "secret": ...}`; the server compares the secret in
constant time and closes the connection on a mismatch, so a process that can reach the socket
but did not start the sidecar cannot drive it.

Besides the frames, this module holds the other definitions both sides must share exactly: the
per-prompt request seed, the safetensors header reader, and how a pushed tensor is read back
for verification (which part of it one tensor-parallel rank holds, and the digest of its bytes).
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
from pathlib import Path

_HEADER = struct.Struct(">I")
# Bounds what an unauthenticated peer can make the server allocate.
MAX_HELLO_BYTES = 4096
MAX_FRAME_BYTES = 1 << 30


class WireError(ConnectionError):
    """The peer closed the connection or sent something that is not a frame."""


def send_frame(sock: socket.socket, message: dict) -> None:
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise WireError(f"connection closed with {remaining} of {size} bytes unread")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> dict:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > max_bytes:
        raise WireError(f"frame of {size} bytes exceeds the {max_bytes}-byte limit")
    try:
        message = json.loads(_recv_exact(sock, size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"frame is not UTF-8 JSON: {e}") from e
    if not isinstance(message, dict):
        raise WireError(f"frame must hold a JSON object, got {type(message).__name__}")
    return message


def request_seed(seed: int, prompt_id: int) -> int:
    """The vLLM request seed for one prompt: a hash of (run seed, prompt id).

    vLLM gives sample i of an n-sample request the seed `request_seed + i`, so every sample's
    randomness is keyed by (seed, prompt_id, sample_index) and not by batch position. The value
    stays below 2**62 so `+ i` never overflows a 64-bit generator seed.
    """
    digest = hashlib.blake2b(f"{int(seed)}:{int(prompt_id)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def safetensors_header(path: str | Path) -> tuple[dict[str, dict], int]:
    """A safetensors file's tensors (name -> {"dtype", "shape", "data_offsets"}) and the byte
    offset where their data starts. Only the header is read."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def shard_region(
    full_shape: list[int], local_shape: list[int], rank: int
) -> tuple[int, int, int] | None:
    """Which part of a full (pushed) tensor one tensor-parallel rank holds, as (dim, start, size):
    the rank's first `size` entries along `dim` are the full tensor's [start, start + size).

    vLLM splits a sharded tensor into equal contiguous blocks along one dimension (the one whose
    size differs), rank r holding block r; a vocabulary-parallel embedding pads the vocabulary
    first, so the last block(s) end in padding rows that are not in the pushed tensor. None when
    the shard is not such a block of the tensor (the caller treats that as a mismatch).
    """
    if len(full_shape) != len(local_shape):
        return None
    differ = [d for d, (f, s) in enumerate(zip(full_shape, local_shape)) if f != s]
    if not differ:
        return (0, 0, full_shape[0]) if full_shape else (0, 0, 0)
    if len(differ) > 1:
        return None
    dim = differ[0]
    start = rank * local_shape[dim]
    size = min(local_shape[dim], full_shape[dim] - start)
    return (dim, start, size) if size > 0 else None


# A region above this many elements is compared on every k-th slice along its first axis
# (k = digest_step): each tensor then costs at most ~8 MB of reading and hashing per side.
MAX_DIGEST_ELEMENTS = 1 << 21


def digest_step(shape: list[int]) -> int:
    """The stride along the first axis at which a region of `shape` is digested."""
    size = 1
    for n in shape:
        size *= n
    return max(1, -(-size // MAX_DIGEST_ELEMENTS))


def digest(data) -> str:
    """The digest both sides compare: blake2b-128 of a tensor region's raw bytes."""
    return hashlib.blake2b(memoryview(data).cast("B"), digest_size=16).hexdigest()
