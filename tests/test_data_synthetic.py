"""The synthetic task: tokenizer, problems with independently computed answers, binary reward."""

import itertools
import re
from collections import Counter

import pytest
from transformers import PreTrainedTokenizerFast

from dynamo_jax.data import (
    SYNTHETIC_VOCAB_SIZE,
    DataConfig,
    SyntheticConfig,
    SyntheticScorer,
    build_prompts,
    make_synthetic_dataset,
    synthetic_tokenizer,
    synthetic_verdict,
)


@pytest.fixture(scope="module")
def tok():
    return synthetic_tokenizer()


def test_vocab_size_covers_the_tokenizer(tok):
    assert SYNTHETIC_VOCAB_SIZE == len(tok) == 32
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 0
    assert max(tok.get_vocab().values()) == SYNTHETIC_VOCAB_SIZE - 1
    for i in range(SYNTHETIC_VOCAB_SIZE):  # every id the model can sample decodes
        assert isinstance(tok.decode([i]), str)


def _expected(op, text, m):
    """Independent oracle: parse the prompt text and compute the answer."""
    nums = [int(x) for x in re.findall(r"\d+", text)]
    if op == "mixed":  # the op word the prompt starts with picks the skill
        op = text[: text.index("(")] if "(" in text else text.split()[0]
        assert op in ("copy", "max", "min"), text
        if op == "min":
            return str(min(nums))
    if op == "copy":
        return str(nums[0])
    if op == "max":
        return str(max(nums))
    assert nums[2] == m
    return str((nums[0] + nums[1]) % m)


@pytest.mark.parametrize(
    "op, m, size",
    [
        ("copy", 7, 7),
        ("max", 4, 16),
        ("add_mod", 5, 25),
        ("add_mod", 10, 100),
        ("mixed", 5, 55),
        ("mixed", 3, 21),
    ],
)
def test_problems_and_answers(op, m, size, tok):
    rows = make_synthetic_dataset(SyntheticConfig(op=op, modulus=m))
    assert len(rows) == size and len({r.prompt_id for r in rows}) == size
    assert [r.index for r in rows] == list(range(size))
    for row in rows:
        assert row.gold == _expected(op, row.messages[0]["content"], m)
        ids = tok(row.messages[0]["content"], add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == row.messages[0]["content"]


def test_existing_token_ids_are_unchanged_by_the_min_word(tok):
    # "min" took the last filler's id, so every older token (and a seeded max run) is as before.
    vocab = tok.get_vocab()
    assert [vocab[w] for w in ("copy", "max", "mod", "0", "9", "<fa>", "<fc>")] == [
        7,
        8,
        9,
        18,
        27,
        28,
        30,
    ]
    assert vocab["min"] == 31 and "<fd>" not in vocab
    assert tok("min(3,1)=")["input_ids"] == [31, 14, 21, 16, 19, 15, 13]


@pytest.mark.parametrize("m", [2, 5, 10])
def test_mixed_answers_are_balanced_over_digits(m):
    rows = make_synthetic_dataset(SyntheticConfig(op="mixed", modulus=m))
    counts = Counter(r.gold for r in rows)
    # min's answers lean low exactly as max's lean high, and copy is uniform: 2m + 1 each.
    assert counts == {str(d): 2 * m + 1 for d in range(m)}
    ops = Counter(re.match(r"[a-z]+", r.messages[0]["content"]).group() for r in rows)
    assert ops == {"copy": m, "max": m * m, "min": m * m}


def test_mixed_prompts_fit_the_tiny_config_prompt_budget(tok):
    rows = make_synthetic_dataset(SyntheticConfig(op="mixed", modulus=5))
    cfg = DataConfig(task="synthetic", system_prompt="", synthetic_op="mixed", max_prompt_tokens=16)
    prompts = build_prompts(rows, tok, cfg)
    assert (prompts.num_truncated, prompts.num_filtered) == (0, 0)
    assert max(map(len, prompts.token_ids)) == 15


def test_num_rows_subsets_or_repeats_with_unique_stable_ids():
    small = make_synthetic_dataset(SyntheticConfig(num_rows=10, seed=1))
    big = make_synthetic_dataset(SyntheticConfig(num_rows=60, seed=1))
    assert len(small) == 10 and len({r.messages[0]["content"] for r in small}) == 10
    assert len(big) == 60 and len({r.prompt_id for r in big}) == 60
    again = make_synthetic_dataset(SyntheticConfig(num_rows=60, seed=1))
    assert [r.prompt_id for r in again] == [r.prompt_id for r in big]


def test_prompts_go_through_the_chat_template_path(tok):
    rows = make_synthetic_dataset(SyntheticConfig(op="add_mod"))
    cfg = DataConfig(task="synthetic", system_prompt="", max_prompt_tokens=32)
    prompts = build_prompts(rows, tok, cfg)
    assert (prompts.num_truncated, prompts.num_filtered) == (0, 0)
    assert tok.decode(prompts.token_ids[7]) == (
        "<|im_start|>user\n1+2 mod 5=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert all(tok.unk_token_id not in ids for ids in prompts.token_ids)


def test_tokenizer_saves_and_reloads_offline(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    again = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "max(3,1)="}]
    kwargs = dict(add_generation_prompt=True, tokenize=True, return_dict=False)
    assert again.apply_chat_template(messages, **kwargs) == tok.apply_chat_template(
        messages, **kwargs
    )
    assert again.eos_token_id == tok.eos_token_id


@pytest.mark.parametrize(
    "text, status",
    [
        ("2", "correct"),
        ("2<|im_end|>", "correct"),
        (" 2", "correct"),
        ("2 + 1", "correct"),
        ("2<|im_end|>7", "correct"),  # after the stop token is not the response
        ("23", "wrong"),
        ("02", "wrong"),
        ("3", "wrong"),
        ("+2", "no_answer"),
        ("<fa>2", "no_answer"),
        ("", "no_answer"),
        ("2" * 1000, "parse_error"),
        (None, "parse_error"),
    ],
)
def test_binary_reward(text, status):
    verdict = synthetic_verdict(text, "2")
    assert verdict.status == status
    assert verdict.reward == (1.0 if status == "correct" else 0.0)


def test_random_policy_success_rate_matches_the_docstring_claim(tok):
    # All 32 x 32 two-token responses (max_new_tokens=2) of a uniform random policy: the first
    # token is the answer digit and the second no digit (22 ways), or whitespace / a dropped
    # special (<|endoftext|>, <|im_start|>) then the digit (4 ways): 26 / 1024 ≈ 2.5%, i.e.
    # ~1.6 rewarded samples per batch of 64.
    correct = sum(
        synthetic_verdict(tok.decode([a, b]), "2").status == "correct"
        for a, b in itertools.product(range(SYNTHETIC_VOCAB_SIZE), repeat=2)
    )
    assert correct == 26


def test_scorer_has_the_pool_interface():
    with SyntheticScorer() as scorer:
        verdicts = scorer.score(["1", "x"], ["1", "1"])
    assert [v.status for v in verdicts] == ["correct", "no_answer"]
    with pytest.raises(ValueError, match="2 completions but 1"):
        SyntheticScorer().score(["1", "2"], ["1"])


def test_config_bridge_and_validation():
    cfg = DataConfig(task="synthetic", synthetic_op="max", synthetic_modulus=3, seed=4)
    assert cfg.synthetic_config() == SyntheticConfig(op="max", modulus=3, num_rows=0, seed=4)
    mixed = DataConfig(task="synthetic", synthetic_op="mixed")
    assert mixed.synthetic_config().op == "mixed"
    with pytest.raises(ValueError, match="DataConfig.synthetic_op"):
        DataConfig(task="synthetic", synthetic_op="min")
    with pytest.raises(ValueError, match="SyntheticConfig.op"):
        SyntheticConfig(op="mul")
    with pytest.raises(ValueError, match="SyntheticConfig.modulus"):
        SyntheticConfig(modulus=1)
