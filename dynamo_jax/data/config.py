"""Configuration of the training/evaluation data: which files or synthetic task, and how prompts
are built from them."""

from __future__ import annotations

import dataclasses
from typing import Literal

from dynamo_jax import validate
from dynamo_jax.data import hub

# Qwen2.5-Math's chain-of-thought system prompt (its evaluation template "qwen25-math-cot").
QWEN_MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."

Task = Literal["math", "synthetic"]
Format = Literal["auto", "parquet", "jsonl"]
Overflow = Literal["truncate_left", "filter"]
OnBadRow = Literal["error", "skip"]
SyntheticOp = Literal["copy", "max", "add_mod", "mixed"]
# Default bound on one JSONL line (bytes, newline included). A row is a prompt and an answer;
# 1 MiB is ~250k tokens, far beyond any `max_prompt_tokens`, so only broken files reach it.
MAX_LINE_BYTES = 1 << 20


def _choice(name: str, value, allowed: tuple) -> None:
    validate.one_of("DataConfig", name, value, allowed)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Data for one run.

    task="math": rows from `paths` (training) and `eval_paths` (evaluation), verl parquet or
    JSONL (chosen by extension when format="auto"), or `hf:org/name[:config][@split]` Hub
    datasets (data/hub.py). task="synthetic": the generated arithmetic
    task of `dynamo_jax.data.synthetic` (fields `synthetic_*`), with its own tokenizer; it uses
    no system prompt, whose words its tiny vocabulary does not have.
    """

    task: Task = "synthetic"
    paths: tuple[str, ...] = ()
    eval_paths: tuple[str, ...] = ()
    format: Format = "auto"
    # "" = no system message. A row that already has one keeps its own.
    system_prompt: str = QWEN_MATH_SYSTEM_PROMPT
    max_prompt_tokens: int = 1024
    # 0 = every training row; M > 0 = the first M rows of `paths` (after loading, before
    # templating). A small pool makes prompts come back within a short run, which the
    # history-based allocation policies (DynaMO, E3) need before they allocate anything unevenly.
    max_train_problems: int = 0
    overflow: Overflow = "truncate_left"
    on_bad_row: OnBadRow = "error"
    # Column/key holding a row id; rows without it get a hash of (source, prompt).
    id_field: str = "id"
    # A JSONL line longer than this (bytes) is refused unparsed (a bad row: see on_bad_row).
    max_line_bytes: int = MAX_LINE_BYTES
    # `hf:` datasets in paths/eval_paths (data/hub.py): the columns holding the prompt and the
    # answer; "" = the dataset's preset (GSM8K, MATH-500), else "prompt" / "answer".
    hub_prompt_column: str = ""
    hub_answer_column: str = ""
    seed: int = 0
    synthetic_op: SyntheticOp = "max"  # the learnable default (see data/synthetic.py)
    synthetic_modulus: int = 5
    synthetic_num_rows: int = 0  # 0 = every distinct problem once

    def __post_init__(self):
        object.__setattr__(self, "paths", _as_paths("paths", self.paths))
        object.__setattr__(self, "eval_paths", _as_paths("eval_paths", self.eval_paths))
        _choice("task", self.task, ("math", "synthetic"))
        _choice("format", self.format, ("auto", "parquet", "jsonl"))
        _choice("overflow", self.overflow, ("truncate_left", "filter"))
        _choice("on_bad_row", self.on_bad_row, ("error", "skip"))
        _choice("synthetic_op", self.synthetic_op, ("copy", "max", "add_mod", "mixed"))
        if self.task == "math" and not self.paths:
            raise ValueError("DataConfig.paths must name at least one file when task='math'")
        if not isinstance(self.system_prompt, str):
            raise ValueError(f"DataConfig.system_prompt must be a str, got {self.system_prompt!r}")
        validate.int_at_least("DataConfig", self, "max_prompt_tokens", 1)
        if not 2 <= self.synthetic_modulus <= 10:
            raise ValueError(
                "DataConfig.synthetic_modulus must be in [2, 10] (answers are one digit), "
                f"got {self.synthetic_modulus}"
            )
        validate.int_at_least("DataConfig", self, "max_line_bytes", 1)
        for name in ("hub_prompt_column", "hub_answer_column"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"DataConfig.{name} must be a str, got {getattr(self, name)!r}")
        for spec in self.paths + self.eval_paths:
            if hub.is_hub_spec(spec):
                hub.parse_spec(spec)  # a malformed spec fails here, before anything loads
        for name in ("synthetic_num_rows", "seed", "max_train_problems"):
            validate.int_at_least("DataConfig", self, name, 0)

    def synthetic_config(self):
        """The `SyntheticConfig` these fields describe (task="synthetic")."""
        from dynamo_jax.data.synthetic import SyntheticConfig

        return SyntheticConfig(
            op=self.synthetic_op,
            modulus=self.synthetic_modulus,
            num_rows=self.synthetic_num_rows,
            seed=self.seed,
        )


def _as_paths(name: str, value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,) if value else ()
    if not all(isinstance(p, str) and p for p in value):
        raise ValueError(f"DataConfig.{name} must be non-empty path strings, got {value!r}")
    return tuple(value)
