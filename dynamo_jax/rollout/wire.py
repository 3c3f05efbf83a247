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
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct

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
