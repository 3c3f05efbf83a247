"""`init.checkpoint = "org/name[@revision]"`: a model on the Hugging Face Hub, as verl and TRL name it.

    init.checkpoint = "Qwen/Qwen2.5-Math-7B"
    init.checkpoint = "Qwen/Qwen2.5-Math-7B@a1b2c3d"   # a branch, tag or commit

`resolve_hub_model(spec)` returns the local snapshot directory `huggingface_hub.snapshot_download`
gives for it: fetched once into the Hub cache, then reused. The library's own variables apply:
`HF_HOME` / `HF_HUB_CACHE` (where the cache is), `HF_HUB_OFFLINE=1` (no network: the cache only),
`HF_TOKEN` (gated or private models), `HF_ENDPOINT` (a mirror). The cache directory and offline
mode are read from the environment at each call (the library reads them once, at import).

A spec is a Hub id when it has the form `org/name[@revision]` and no local directory of that name
exists: a local directory always wins, as in `transformers.from_pretrained`. A model that is
neither cached nor reachable is one `MissingFileError` line saying how to fetch it elsewhere.
huggingface_hub ships with transformers, a core dependency; `[hub]` pins its range.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dynamo_jax.errors import MissingFileError

# The Hub's repo id rules (huggingface_hub.utils.validate_repo_id): letters, digits, "-", "_", ".";
# a revision is a branch, tag or commit (branches may hold "/").
_HUB_ID = re.compile(
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})"
    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_./-]*))?"
)
_TRUE = {"1", "on", "yes", "true"}


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) if `spec` names a Hub model rather than a local directory."""
    match = _HUB_ID.fullmatch(spec)
    if match is None or Path(spec).expanduser().exists():
        return None
    return match.group("repo"), match.group("revision")


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, as huggingface_hub reads it."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in _TRUE:
            return True
    return False


def hub_cache_dir() -> Path:
    """The Hub cache huggingface_hub uses: $HF_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise MissingFileError(
            "Hub model ids need huggingface_hub: pip install 'dynamo_jax[hub]'"
        ) from None
    return huggingface_hub


def resolve_hub_model(spec: str, *, field: str = "init.checkpoint") -> str:
    """The local snapshot directory of the Hub model `spec` ("org/name[@revision]")."""
    parsed = parse_hub_id(spec)
    if parsed is None:
        raise MissingFileError(f"{field} {spec!r}: not a Hub model id (org/name[@revision])")
    repo, revision = parsed
    hub = _import_hub()
    cache = hub_cache_dir()
    is_offline = offline()
    try:
        path = hub.snapshot_download(
            repo, revision=revision, cache_dir=str(cache), local_files_only=is_offline
        )
    # Every failure to find or fetch it is an OSError in huggingface_hub (LocalEntryNotFoundError,
    # OfflineModeIsEnabled, HfHubHTTPError: not found, gated, no such revision).
    except OSError as exc:
        rev = f" --revision {revision}" if revision else ""
        why = "HF_HUB_OFFLINE is set" if is_offline else _first_line(exc)
        raise MissingFileError(
            f"{field} {spec!r}: not in the Hub cache {cache} and cannot be downloaded ({why}); "
            f"fetch it where the Hub is reachable with `hf download {repo}{rev}` and copy that "
            "machine's Hub cache here (or set HF_HOME to it)"
        ) from None
    return str(path)


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
