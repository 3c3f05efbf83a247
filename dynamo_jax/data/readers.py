"""Readers for the verl parquet layout and JSONL, with per-row validation.

verl parquet: `data_source` (str), `prompt` (list of {role, content}), `reward_model`
({ground_truth, style}), optional `rank` (difficulty prior in [0, 1]) and id column.
JSONL: one object a line with `prompt` (str, or a message list), `answer` (str), `source`
(str; the file's stem when absent) and an optional id key.

A malformed row raises `DataError` naming the file, the row (parquet: 0-based row; JSONL:
1-based line) and the field; with on_bad_row="skip" it is counted, logged and dropped instead.
A JSONL line is malformed also when it is not UTF-8, not JSON, nested too deeply for the
parser, or holds a string that is not valid Unicode (a lone surrogate escape such as
`"\\ud800"`, which `json` accepts but nothing downstream can encode); a UTF-8 byte-order mark
at the start of the file is accepted. A line holding an object with a repeated key
(`{"answer": "1", "answer": "2"}`) is malformed too: `json` would keep the last value silently.
A line longer than `max_line_bytes` is refused without being parsed: lines are read in bounded
chunks, so a 50 MB line costs a scan, not a JSON parse (nor 50 MB of memory).
A file that cannot be read at all (missing, empty, not parquet, no rows) raises `DataError`
naming it, whatever on_bad_row says. A path that is not a regular file (a directory, a named
pipe, a socket, a device such as /dev/zero) is refused by what it is, from `os.stat`, before
anything opens it: opening a FIFO for reading blocks until a writer comes, and a device can
stream forever.
Ground truths that are present but empty load (6 training rows have one); they are counted in
the report because no completion can ever be scored correct against them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dynamo_jax.data import hub
from dynamo_jax.data.config import MAX_LINE_BYTES
from dynamo_jax.data.rows import ROLES, Message, Row, content_id, explicit_id
from dynamo_jax.errors import DataError

logger = logging.getLogger(__name__)

PARQUET_COLUMNS = ("data_source", "prompt", "reward_model")
_MAX_LOGGED_SKIPS = 10
_BOM = b"\xef\xbb\xbf"
# Bytes read at a time while skipping the rest of an over-long line.
_SKIP_CHUNK = 1 << 20

__all__ = ["DataError", "IdAssigner", "LoadReport", "load_files", "load_rows", "read_rows"]


class _FieldError(Exception):
    def __init__(self, field: str, problem: str):
        super().__init__(f"field '{field}': {problem}")
        self.field = field


@dataclasses.dataclass
class LoadReport:
    """What one `read_rows` call loaded and dropped."""

    path: str
    loaded: int = 0
    skipped: int = 0
    empty_gold: int = 0
    skip_reasons: list[str] = dataclasses.field(default_factory=list)


def detect_format(path: str | Path, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise DataError(f"{path}: cannot tell the format from the extension {suffix!r}; set format")


def _unicode(field: str, value: str) -> str:
    """`value` if it encodes as UTF-8 (JSON's `\\ud800` escape decodes to a str that does not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _FieldError(
            field,
            f"not valid Unicode: lone surrogate {value[exc.start]!r} at character {exc.start}",
        ) from None
    return value


def _messages(value, field: str) -> tuple[Message, ...]:
    if isinstance(value, str):
        if not value.strip():
            raise _FieldError(field, "empty prompt")
        return ({"role": "user", "content": _unicode(field, value)},)
    if not isinstance(value, list | tuple):
        raise _FieldError(
            field, f"must be a string or a list of messages, got {type(value).__name__}"
        )
    if not value:
        raise _FieldError(field, "empty message list")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _FieldError(
                f"{field}[{i}]", f"must be a {{role, content}} object, got {type(message).__name__}"
            )
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise _FieldError(f"{field}[{i}].role", f"must be one of {ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise _FieldError(
                f"{field}[{i}].content", f"must be a str, got {type(content).__name__}"
            )
        if not content.strip():
            raise _FieldError(f"{field}[{i}].content", "empty")
        messages.append({"role": role, "content": _unicode(f"{field}[{i}].content", content)})
    if messages[-1]["role"] != "user":
        raise _FieldError(field, "the last message must be from the user")
    return tuple(messages)


def _string(record: dict, field: str, value, *, allow_empty: bool) -> str:
    if value is None:
        raise _FieldError(field, "missing")
    if not isinstance(value, str):
        raise _FieldError(field, f"must be a str, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise _FieldError(field, "empty")
    return _unicode(field, value)


def _rank(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _FieldError("rank", f"must be a number or null, got {type(value).__name__}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise _FieldError("rank", f"must lie in [0, 1], got {value}")
    return float(value)


def _parse_parquet_record(record: dict, path: Path) -> tuple:
    source = _string(record, "data_source", record.get("data_source"), allow_empty=False)
    messages = _messages(record.get("prompt"), "prompt")
    reward_model = record.get("reward_model")
    if not isinstance(reward_model, dict):
        raise _FieldError(
            "reward_model", f"must be a {{ground_truth, style}} object, got {reward_model!r}"
        )
    gold = _string(
        record, "reward_model.ground_truth", reward_model.get("ground_truth"), allow_empty=True
    )
    return messages, gold, source, _rank(record.get("rank"))


def _parse_jsonl_record(record, path: Path) -> tuple:
    if not isinstance(record, dict):
        raise _FieldError("<line>", f"must be a JSON object, got {type(record).__name__}")
    source = record.get("source", Path(path).stem)
    source = _string(record, "source", source, allow_empty=False)
    messages = _messages(record.get("prompt"), "prompt")
    gold = _string(record, "answer", record.get("answer"), allow_empty=True)
    return messages, gold, source, _rank(record.get("rank"))


def _parquet_records(path: Path) -> Iterator[tuple[str, dict | Exception]]:
    try:
        with _open_regular(path) as f:
            table = pq.read_table(f)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    missing = [c for c in PARQUET_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing} (verl layout needs {PARQUET_COLUMNS})"
        )
    for i, record in enumerate(table.to_pylist()):
        yield f"row {i}", record


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """`json` object hook: a dict, unless a key repeats (then `_DuplicateKey` names it)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return record


def _json_line(raw: bytes):
    """One parsed JSONL line, or the `_FieldError` that says why it is not one."""
    try:
        line = raw.decode("utf-8").rstrip("\r\n")  # column numbers within this line
    except UnicodeDecodeError as exc:
        return _FieldError(
            "<line>", f"not UTF-8 (byte 0x{raw[exc.start]:02x} at position {exc.start} of the line)"
        )
    try:
        return json.loads(line, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        return _FieldError(exc.key, "duplicated key in one object (which value is meant?)")
    except json.JSONDecodeError as exc:
        return _FieldError("<line>", f"invalid JSON ({exc.msg}: column {exc.colno})")
    except RecursionError:
        return _FieldError("<line>", "JSON nested too deeply to parse")
    except ValueError as exc:  # e.g. an integer longer than Python's int-conversion limit
        return _FieldError("<line>", f"invalid JSON ({exc})")


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words, from its `st_mode`."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def check_regular_file(path: Path) -> os.stat_result:
    """`path`'s stat if it is a regular file, else `DataError` saying what it is (never opens)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{path}: is {_file_kind(info.st_mode)}, not a file")
    return info


def _open_regular(path: Path):
    """`path` opened for binary reading, refusing anything that is not a regular file.

    O_NONBLOCK so that a FIFO swapped in after the `os.stat` check cannot block the open; the
    descriptor's own fstat is then checked (it has no effect on regular files).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DataError(f"{path}: is {_file_kind(mode)}, not a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _bounded_lines(f, max_bytes: int) -> Iterator[tuple[bytes, int]]:
    """(line, length) for each line; an over-long line is yielded as b"" with its full length.

    `readline(limit)` never holds more than `max_bytes + 1` bytes; the rest of an over-long
    line is consumed in fixed-size chunks and counted, not kept.
    """
    while True:
        raw = f.readline(max_bytes + 1)
        if not raw:
            return
        if len(raw) <= max_bytes or raw.endswith(b"\n"):
            yield raw, len(raw)
            continue
        length = len(raw)
        while not raw.endswith(b"\n"):
            raw = f.readline(_SKIP_CHUNK)
            if not raw:
                break
            length += len(raw)
        yield b"", length


def _jsonl_records(
    path: Path, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[str, dict | Exception]]:
    # Bytes, decoded line by line: one bad byte is then one bad line, not a crash of the file.
    try:
        with _open_regular(path) as f:
            for number, (raw, length) in enumerate(_bounded_lines(f, max_line_bytes), start=1):
                if length > max_line_bytes:
                    yield (
                        f"line {number}",
                        _FieldError(
                            "<line>",
                            f"{length} bytes, longer than max_line_bytes={max_line_bytes} "
                            "(not parsed)",
                        ),
                    )
                    continue
                if number == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM) :]
                if not raw.strip():
                    continue
                yield f"line {number}", _json_line(raw)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _hub_records(spec: str, columns: tuple[str, str], id_field: str):
    """data/hub.py's records, a row's unusable column as the `_FieldError` naming it."""
    prompt_column, answer_column = columns
    rows = hub.hub_records(
        spec, prompt_column=prompt_column, answer_column=answer_column, id_field=id_field
    )
    for where, record in rows:
        if isinstance(record, hub.RowProblem):
            record = _FieldError(record.column, record.problem)
        yield where, record


class IdAssigner:
    """Stable, unique prompt ids across all files of one dataset (see `rows.content_id`)."""

    def __init__(self):
        self._occurrences: collections.Counter = collections.Counter()
        self._owner: dict[int, str] = {}

    def assign(
        self,
        raw_id,
        source: str,
        messages: tuple[Message, ...],
        gold: str,
        where: str,
        id_field: str,
    ) -> int:
        if raw_id is not None:
            try:
                prompt_id = explicit_id(raw_id)
            except (TypeError, ValueError) as exc:
                raise _FieldError(id_field, str(exc)) from None
        else:
            key = (source, tuple((m["role"], m["content"]) for m in messages), gold)
            prompt_id = content_id(source, messages, gold, self._occurrences[key])
            self._occurrences[key] += 1
        if prompt_id in self._owner:
            raise _FieldError(
                id_field, f"duplicate prompt id {prompt_id} (first at {self._owner[prompt_id]})"
            )
        self._owner[prompt_id] = where
        return prompt_id


def read_rows(
    path: str | Path,
    *,
    fmt: str = "auto",
    on_bad_row: str = "error",
    id_field: str = "id",
    start_index: int = 0,
    ids: IdAssigner | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    hub_columns: tuple[str, str] = ("", ""),
) -> tuple[list[Row], LoadReport]:
    """Rows of one file, or of an `hf:` Hub dataset (data/hub.py), with dense indices from
    `start_index`, and what was loaded/skipped. `hub_columns` = (prompt, answer) columns of an
    `hf:` dataset ("" = its preset's)."""
    if hub.is_hub_spec(path):
        records = _hub_records(path, hub_columns, id_field)
        parse = _parse_jsonl_record
    else:
        path = Path(path)
        if check_regular_file(path).st_size == 0:
            raise DataError(f"{path}: the file is empty")
        fmt = detect_format(path, fmt)
        if fmt == "parquet":
            records = _parquet_records(path)
        else:
            records = _jsonl_records(path, max_line_bytes)
        parse = _parse_parquet_record if fmt == "parquet" else _parse_jsonl_record
    ids = ids if ids is not None else IdAssigner()
    report = LoadReport(str(path))
    rows: list[Row] = []
    for where, record in records:
        try:
            if isinstance(record, Exception):
                raise record
            messages, gold, source, rank = parse(record, path)
            raw_id = record.get(id_field)
            prompt_id = ids.assign(raw_id, source, messages, gold, f"{path} {where}", id_field)
        except _FieldError as exc:
            message = f"{path}: {where}: {exc}"
            if on_bad_row == "error":
                raise DataError(message) from None
            report.skipped += 1
            if len(report.skip_reasons) < _MAX_LOGGED_SKIPS:
                report.skip_reasons.append(message)
                logger.warning("skipping bad row: %s", message)
            continue
        report.empty_gold += not gold.strip()
        rows.append(
            Row(prompt_id, start_index + len(rows), messages, gold, source, rank, f"{path} {where}")
        )
    report.loaded = len(rows)
    if not rows:
        if not report.skipped:
            raise DataError(f"{path}: no rows")
        first = report.skip_reasons[0].removeprefix(f"{path}: ")
        raise DataError(
            f"{path}: no usable rows ({report.skipped} bad row(s) skipped; first: {first})"
        )
    if report.skipped:
        logger.warning("%s: skipped %d bad row(s), loaded %d", path, report.skipped, report.loaded)
    if report.empty_gold:
        logger.warning(
            "%s: %d row(s) have an empty ground truth (never rewarded)", path, report.empty_gold
        )
    return rows, report


def load_rows(
    path: str | Path,
    *,
    fmt: str = "auto",
    on_bad_row: str = "error",
    id_field: str = "id",
    max_line_bytes: int = MAX_LINE_BYTES,
    hub_columns: tuple[str, str] = ("", ""),
) -> list[Row]:
    """Rows of one file; see `read_rows` for the report of skipped rows."""
    return read_rows(
        path,
        fmt=fmt,
        on_bad_row=on_bad_row,
        id_field=id_field,
        max_line_bytes=max_line_bytes,
        hub_columns=hub_columns,
    )[0]


def load_files(
    paths: Sequence[str | Path],
    *,
    fmt: str = "auto",
    on_bad_row: str = "error",
    id_field: str = "id",
    max_line_bytes: int = MAX_LINE_BYTES,
    hub_columns: tuple[str, str] = ("", ""),
) -> tuple[list[Row], list[LoadReport]]:
    """Rows of several files as one dataset: dense indices and unique ids across the files."""
    ids = IdAssigner()
    rows: list[Row] = []
    reports = []
    for path in paths:
        more, report = read_rows(
            path,
            fmt=fmt,
            on_bad_row=on_bad_row,
            id_field=id_field,
            start_index=len(rows),
            ids=ids,
            max_line_bytes=max_line_bytes,
            hub_columns=hub_columns,
        )
        rows.extend(more)
        reports.append(report)
    return rows, reports
