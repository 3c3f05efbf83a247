"""Datasets (verl parquet, JSONL), prompt templating, the epoch iterator and the synthetic task."""

from dynamo_jax.data.config import QWEN_MATH_SYSTEM_PROMPT, DataConfig
from dynamo_jax.data.iterator import Batch, EpochIterator
from dynamo_jax.data.prompts import PromptSet, build_prompts, render_prompt
from dynamo_jax.data.readers import DataError, LoadReport, load_files, load_rows, read_rows
from dynamo_jax.data.rows import Row
from dynamo_jax.data.synthetic import (
    SYNTHETIC_VOCAB_SIZE,
    SyntheticConfig,
    SyntheticScorer,
    make_synthetic_dataset,
    synthetic_tokenizer,
    synthetic_verdict,
)

__all__ = [
    "QWEN_MATH_SYSTEM_PROMPT",
    "SYNTHETIC_VOCAB_SIZE",
    "Batch",
    "DataConfig",
    "DataError",
    "EpochIterator",
    "LoadReport",
    "PromptSet",
    "Row",
    "SyntheticConfig",
    "SyntheticScorer",
    "build_prompts",
    "load_files",
    "load_rows",
    "make_synthetic_dataset",
    "read_rows",
    "render_prompt",
    "synthetic_tokenizer",
    "synthetic_verdict",
]
