"""Prompt construction: chat template, system prompt, and the prompt-length limit.

The tokenizer's own chat template is the single source of the prompt format, so the trainer
sees the same tokens as an inference server given the same messages.

Over-long prompts (more than `max_prompt_tokens` ids after templating) are either dropped
("filter") or cut from the left ("truncate_left": keep the last `max_prompt_tokens` ids, as
verl's `truncation="left"` does; the question's end and the assistant header survive, the
system prompt may not). Both counts are reported.

A row the chat template refuses (templates may `raise_exception`, e.g. on a system message
that is not first) is a `DataError` naming the file and row it came from.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import jinja2

from dynamo_jax.data.config import DataConfig
from dynamo_jax.data.rows import Message, Row
from dynamo_jax.errors import ConfigError, DataError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Rows that survived the length limit and their prompt token ids (same order)."""

    rows: tuple[Row, ...]
    token_ids: tuple[tuple[int, ...], ...]
    num_truncated: int
    num_filtered: int

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return tuple(row.prompt_id for row in self.rows)


def with_system_prompt(messages: Sequence[Message], system_prompt: str) -> list[Message]:
    """Prepend the system prompt unless it is empty or the row brings its own."""
    messages = [dict(m) for m in messages]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render_prompt(messages: Sequence[Message], tokenizer, system_prompt: str) -> str:
    """The chat-templated prompt text, ending with the assistant header."""
    return tokenizer.apply_chat_template(
        with_system_prompt(messages, system_prompt), add_generation_prompt=True, tokenize=False
    )


def _render_row(row: Row, tokenizer, system_prompt: str) -> str:
    try:
        return render_prompt(row.messages, tokenizer, system_prompt)
    except jinja2.TemplateError as exc:
        where = row.origin or f"row {row.index} (prompt id {row.prompt_id})"
        raise DataError(
            f"{where}: field 'prompt': the tokenizer's chat template rejects it ({exc})"
        ) from None


def build_prompts(rows: Sequence[Row], tokenizer, cfg: DataConfig) -> PromptSet:
    """Template and tokenize every row, then apply the length limit.

    Rendering and tokenizing separately lets the fast tokenizer encode all prompts in one batch
    call; it gives the same ids as `apply_chat_template(tokenize=True)` because that also
    encodes the rendered text without adding special tokens (tested).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise ConfigError(
            f"{name}: the tokenizer has no chat template ('chat_template' in "
            "tokenizer_config.json or chat_template.jinja)"
        )
    texts = [_render_row(row, tokenizer, cfg.system_prompt) for row in rows]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    limit = cfg.max_prompt_tokens
    kept_rows, kept_ids = [], []
    truncated = filtered = 0
    for row, ids in zip(rows, encoded):
        if len(ids) > limit:
            if cfg.overflow == "filter":
                filtered += 1
                continue
            ids = ids[-limit:]
            truncated += 1
        kept_rows.append(row)
        kept_ids.append(tuple(int(i) for i in ids))
    if truncated or filtered:
        logger.info(
            "prompts over %d tokens: %d truncated on the left, %d filtered (of %d)",
            limit,
            truncated,
            filtered,
            len(rows),
        )
    return PromptSet(tuple(kept_rows), tuple(kept_ids), truncated, filtered)
