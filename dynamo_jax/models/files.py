"""The JSON files of a model directory (config.json, the tokenizer's files, the safetensors
index), read so that a damaged one is an error naming the file and what is wrong with it.

`json.loads` alone reports "Expecting value: line 1 column 1" with no file, and the readers in
transformers pass such errors through unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynamo_jax.errors import ConfigError


def read_json_object(file: str | Path, error: type[ValueError] = ConfigError) -> dict[str, Any]:
    """The JSON object in `file`; anything else raises `error` naming the file and the problem."""
    file = Path(file)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise error(f"{file}: cannot read ({exc.strerror or exc})") from None
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        raise error(
            f"{file}: invalid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise error(f"{file}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # bytes that are not UTF-8/16/32
        raise error(f"{file}: invalid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise error(f"{file}: must be a JSON object, got {type(value).__name__}")
    return value
