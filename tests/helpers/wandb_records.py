"""The records of a W&B run's transaction log (`run-<id>.wandb`), read back with wandb's protobuf.

wandb writes every record of a run (its config, each logged step, the summary, the exit) to the
.wandb file, in LevelDB's log format: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each `crc32c (4) | length (2, little-endian) | type (1) | data`, a record
being one FULL chunk or FIRST, MIDDLE..., LAST. wandb ships no Python reader of that framing (its
reader is in the Go core), so the framing is read here and each record is parsed by wandb's own
`wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B" and data[4:6] == b"\xe1\xbe", f"{path}: not a .wandb file"
    pos, pending, payloads = _HEADER, b"", []
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            payloads.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            payloads.append(pending + chunk)
        else:
            raise AssertionError(f"{path}: chunk type {kind} at byte {pos}")
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def run_files(workdir: Path) -> list[Path]:
    """The .wandb files of a workdir's W&B runs, oldest first."""
    return sorted((Path(workdir) / "wandb").glob("*run-*/run-*.wandb"))


def history(records) -> dict[int, dict]:
    """{step: {key: value}} of the logged steps."""
    steps = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {
                "/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json)
                for i in r.history.item
            }
            steps[int(r.history.step.num)] = items
    return steps


def _items(update) -> dict:
    return {
        "/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in update
    }


def config(records) -> dict:
    """The run's config: the run record's, then each config update."""
    out = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(_items(r.run.config.update))
        elif kind == "config":
            out.update(_items(r.config.update))
    return out


def summary(records) -> dict:
    out = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            out.update(_items(r.summary.update))
    return out


def run_ids(records) -> set[str]:
    return {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"}
