"""Prompt construction through the tokenizer's chat template, and the length limit."""

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dynamo_jax.data import QWEN_MATH_SYSTEM_PROMPT, DataConfig, build_prompts, load_rows
from dynamo_jax.data.rows import Row
from dynamo_jax.errors import ConfigError, DataError

MATH = Path(__file__).resolve().parents[1] / "data" / "math"

# Qwen2.5's message layout (without its default system prompt and tool branches).
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def rows():
    return load_rows(MATH / "valid.parquet")


@pytest.fixture(scope="module")
def tokenizer(rows):
    """A small byte-level BPE trained on the problems (no downloads)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(
        [r.messages[0]["content"] for r in rows] + [QWEN_MATH_SYSTEM_PROMPT], trainer
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE,
    )


def _reference_ids(row, tokenizer, system_prompt):
    messages = [dict(m) for m in row.messages]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_batched_prompts_equal_apply_chat_template(rows, tokenizer):
    cfg = DataConfig(task="math", paths=("x",), max_prompt_tokens=100_000)
    prompts = build_prompts(rows, tokenizer, cfg)
    assert (prompts.num_truncated, prompts.num_filtered) == (0, 0)
    assert len(prompts.token_ids) == len(rows) and prompts.rows == tuple(rows)
    for row, ids in list(zip(rows, prompts.token_ids))[:64]:
        assert list(ids) == _reference_ids(row, tokenizer, QWEN_MATH_SYSTEM_PROMPT)
    text = tokenizer.decode(prompts.token_ids[0])
    assert text.startswith("<|im_start|>system\n" + QWEN_MATH_SYSTEM_PROMPT + "<|im_end|>\n")
    assert text.endswith(rows[0].messages[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n")


def test_system_prompt_off_and_row_system_message_kept(tokenizer):
    own = Row(
        1,
        0,
        ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1"}),
        "2",
        "t",
    )
    plain = Row(2, 1, ({"role": "user", "content": "1+1"},), "2", "t")
    with_default = build_prompts([own, plain], tokenizer, DataConfig(task="math", paths=("x",)))
    texts = [tokenizer.decode(ids) for ids in with_default.token_ids]
    assert texts[0].count("<|im_start|>system") == 1 and "Be brief." in texts[0]
    assert QWEN_MATH_SYSTEM_PROMPT in texts[1]
    off = build_prompts([plain], tokenizer, DataConfig(task="math", paths=("x",), system_prompt=""))
    assert (
        tokenizer.decode(off.token_ids[0])
        == "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("overflow", ["truncate_left", "filter"])
def test_length_limit_truncates_left_or_filters_with_counts(rows, tokenizer, overflow):
    limit = 120
    full = build_prompts(
        rows, tokenizer, DataConfig(task="math", paths=("x",), max_prompt_tokens=100_000)
    )
    over = sum(len(ids) > limit for ids in full.token_ids)
    assert 0 < over < len(rows)
    cfg = DataConfig(task="math", paths=("x",), max_prompt_tokens=limit, overflow=overflow)
    cut = build_prompts(rows, tokenizer, cfg)
    if overflow == "truncate_left":
        assert (cut.num_truncated, cut.num_filtered) == (over, 0)
        assert cut.rows == full.rows
        for long, short in zip(full.token_ids, cut.token_ids):
            assert short == long[-limit:]  # the question's end and the assistant header survive
    else:
        assert (cut.num_truncated, cut.num_filtered) == (0, over)
        assert len(cut.rows) == len(rows) - over
        assert all(len(ids) <= limit for ids in cut.token_ids)
        kept = {r.prompt_id for r in cut.rows}
        assert all(
            (len(ids) <= limit) == (r.prompt_id in kept)
            for r, ids in zip(full.rows, full.token_ids)
        )


def test_data_config_validation_names_fields():
    with pytest.raises(ValueError, match="DataConfig.paths"):
        DataConfig(task="math")
    with pytest.raises(ValueError, match="DataConfig.overflow"):
        DataConfig(overflow="truncate_right")
    with pytest.raises(ValueError, match="DataConfig.on_bad_row"):
        DataConfig(on_bad_row="ignore")
    with pytest.raises(ValueError, match="DataConfig.max_prompt_tokens"):
        DataConfig(max_prompt_tokens=0)
    with pytest.raises(ValueError, match="DataConfig.synthetic_modulus"):
        DataConfig(synthetic_modulus=11)
    assert DataConfig(task="math", paths="a.jsonl").paths == ("a.jsonl",)


# Qwen3-style: a system message anywhere but first is refused by the template itself.
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_row_the_chat_template_refuses_names_its_file_and_row(tmp_path, tokenizer):
    # The reader accepts a system message after the first; this template does not, and its
    # jinja2 TemplateError used to reach the user without the file or row.
    strict = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer,
        eos_token="<|im_end|>",
        chat_template=STRICT_TEMPLATE,
    )
    late_system = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
    ]
    path = tmp_path / "data.jsonl"
    lines = [{"prompt": "2+2?", "answer": "4"}, {"prompt": late_system, "answer": "2"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cfg = DataConfig(task="math", paths=(str(path),), system_prompt="")
    with pytest.raises(DataError) as info:
        build_prompts(load_rows(path), strict, cfg)
    assert str(info.value) == (
        f"{path} line 2: field 'prompt': the tokenizer's chat template rejects it "
        "(System message must be at the beginning.)"
    )
    unread = Row(7, 3, tuple(late_system), "2", "t")  # built in code: no file to name
    with pytest.raises(DataError, match=r"^row 3 \(prompt id 7\): field 'prompt'"):
        build_prompts([unread], strict, cfg)


def test_tokenizer_without_chat_template_is_a_config_error(tokenizer):
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ConfigError, match="has no chat template"):
        build_prompts([], bare, DataConfig(task="math", paths=("x",)))
