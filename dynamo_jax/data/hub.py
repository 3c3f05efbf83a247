"""`hf:org/name[:config][@split]` in data.paths / data.eval_paths: a dataset on the Hugging Face Hub.

    data.paths = ("hf:openai/gsm8k:main@train",)
    data.eval_paths = ("hf:HuggingFaceH4/MATH-500@test",)

The rows come from `datasets.load_dataset(name, config, split=split)`, which downloads once into
the datasets cache and, with HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1), reads that cache only.
Each row's prompt and answer are read from two columns:

- the presets below, for the datasets of the RLVR papers: GSM8K (`question`, and the answer is
  what follows `####` in `answer`, commas dropped, as verl's gsm8k preprocessing does) and
  MATH-500 (`problem`, `answer`); a preset also gives the default config and split;
- otherwise `data.hub_prompt_column` / `data.hub_answer_column` ("prompt" / "answer" when empty),
  which also override a preset's columns (an answer column named there is taken whole: no
  `####` extraction).

A row's `source` (its evaluation group) is the dataset's name without the organisation. The rows
then pass the same checks as a JSONL line (readers.py): a missing or non-string prompt or answer,
an empty prompt, a bad id are one line naming the spec, the row (0-based) and the column, and
data.on_bad_row decides between stopping and skipping. A dataset that cannot be loaded (not
cached offline, no such config or split, no such column) is one `DataError` line.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

from dynamo_jax.errors import DataError

PREFIX = "hf:"
_SPEC = re.compile(
    r"hf:(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)"
    r"(?::(?P<config>[A-Za-z0-9][A-Za-z0-9_.-]*))?"
    r"(?:@(?P<split>[A-Za-z0-9][A-Za-z0-9_.\[\]:%+-]*))?"
)


@dataclasses.dataclass(frozen=True)
class Preset:
    """How one Hub dataset's rows become prompts and answers."""

    prompt_column: str
    answer_column: str
    config: str | None = None  # the config when the spec names none
    split: str = "train"  # the split when the spec names none
    answer_after: str = ""  # the answer is the text after this marker (GSM8K's "####")


PRESETS: dict[str, Preset] = {
    "openai/gsm8k": Preset("question", "answer", config="main", answer_after="####"),
    "HuggingFaceH4/MATH-500": Preset("problem", "answer", split="test"),
}
_DEFAULT = Preset("prompt", "answer")


@dataclasses.dataclass(frozen=True)
class HubDataset:
    """A parsed `hf:` spec with its preset applied."""

    spec: str
    repo: str
    config: str | None
    split: str
    preset: Preset

    @property
    def source(self) -> str:
        return self.repo.split("/")[-1]


def is_hub_spec(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def parse_spec(spec: str) -> HubDataset:
    """`hf:org/name[:config][@split]` → `HubDataset` (ValueError naming the expected form)."""
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"{spec!r}: expected 'hf:org/name[:config][@split]'")
    repo = match.group("repo")
    preset = PRESETS.get(repo, _DEFAULT)
    return HubDataset(
        spec=spec,
        repo=repo,
        config=match.group("config") or preset.config,
        split=match.group("split") or preset.split,
        preset=preset,
    )


def datasets_cache_dir() -> Path:
    """The datasets cache: $HF_DATASETS_CACHE, else $HF_HOME/datasets, else
    $XDG_CACHE_HOME/huggingface/datasets, else ~/.cache/huggingface/datasets (read at each call:
    the library reads it once, at import)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "datasets"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "datasets"


def load_split(dataset: HubDataset):
    """The `datasets.Dataset` of the spec's split (DataError when it cannot be had)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{dataset.spec}: hf: datasets need the datasets package: pip install 'dynamo_jax[hub]'"
        ) from None
    cache = datasets_cache_dir()
    try:
        return datasets.load_dataset(
            dataset.repo, dataset.config, split=dataset.split, cache_dir=str(cache)
        )
    except Exception as exc:  # datasets raises many kinds (ConnectionError, ValueError, ...)
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        config = f" {dataset.config}" if dataset.config else ""
        raise DataError(
            f"{dataset.spec}: cannot load {dataset.repo}{config} split {dataset.split!r} from the "
            f"datasets cache {cache} or the Hub ({why}); where the Hub is reachable, run "
            f"`datasets.load_dataset({dataset.repo!r}, {dataset.config!r})` once and copy that "
            "cache here (or set HF_HOME to it)"
        ) from None


class RowProblem(Exception):
    """One row's column is unusable: `column` and what is wrong (readers.py makes it a line)."""

    def __init__(self, column: str, problem: str):
        super().__init__(problem)
        self.column, self.problem = column, problem


def final_answer(text: str, marker: str) -> str:
    """The text after the last `marker`, trimmed, thousands' commas dropped (GSM8K: "#### 1,000"
    → "1000")."""
    if marker not in text:
        raise ValueError(f"no {marker!r} before the final answer")
    return text.rsplit(marker, 1)[1].strip().replace(",", "")


def hub_records(
    spec: str, *, prompt_column: str = "", answer_column: str = "", id_field: str = "id"
) -> Iterator[tuple[str, dict | RowProblem]]:
    """("row i", a JSONL-style record {prompt, answer, source[, id]}) for each row of `spec`, or
    ("row i", RowProblem) for a row whose prompt or answer column is unusable."""
    try:
        dataset = parse_spec(spec)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    prompt_col = prompt_column or dataset.preset.prompt_column
    answer_col = answer_column or dataset.preset.answer_column
    table = load_split(dataset)
    missing = [c for c in (prompt_col, answer_col) if c not in table.column_names]
    if missing:
        raise DataError(
            f"{spec}: no column(s) {missing} (columns: {table.column_names}); set "
            "data.hub_prompt_column / data.hub_answer_column"
        )
    for i, row in enumerate(table):
        where = f"row {i}"
        prompt, answer = row.get(prompt_col), row.get(answer_col)
        if not isinstance(prompt, str):
            yield where, RowProblem(prompt_col, f"must be a str, got {type(prompt).__name__}")
            continue
        if not isinstance(answer, str):
            yield where, RowProblem(answer_col, f"must be a str, got {type(answer).__name__}")
            continue
        if dataset.preset.answer_after and not answer_column:  # a named column is taken whole
            try:
                answer = final_answer(answer, dataset.preset.answer_after)
            except ValueError as exc:
                yield where, RowProblem(answer_col, str(exc))
                continue
        record = {"prompt": prompt, "answer": answer, "source": dataset.source}
        if row.get(id_field) is not None:
            record[id_field] = row[id_field]
        yield where, record
