"""A Hugging Face Hub cache laid out as huggingface_hub lays out a download (tests read it back
with the library's own `scan_cache_dir` and `snapshot_download`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def put_in_hub_cache(cache: Path, repo: str, model_dir: Path, commit: str, ref: str = "main"):
    """`model_dir`'s files as a downloaded snapshot of `repo` at `commit` (branch `ref`)."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(model_dir.iterdir()):
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return snapshot
