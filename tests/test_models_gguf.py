"""GGUF import against transformers' own GGUF loader (the oracle): weights, logits, tokenizer."""

import json

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf_fixtures import CORPUS, train_bpe, write_tiny_gguf
from hf_fixtures import hf_logits, make_tiny_hf_model
from safetensors.numpy import load_file

from dynamo_jax.errors import DataError, MissingFileError
from dynamo_jax.models import hf_io, qwen
from dynamo_jax.models.gguf_import import gguf_to_hf_dir
from dynamo_jax.models.tokenizer import encode_chat, load_tokenizer

VOCAB = 384
TOKENS = np.array([[0, 0, 5, 60, 7, 90, 311], [3, 100, 4, 1, 5, 200, 383]])
MASK = np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
CHATS = [
    [{"role": "user", "content": "What is 12 + 345?\n\n  Answer  with\ta number."}],
    [
        {"role": "system", "content": "Be brief.\n\n"},
        {"role": "user", "content": "  Tom has 7 apples.\t\tHow many?\n\n\n"},
        {"role": "assistant", "content": "7\n"},
    ],
]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(VOCAB)


def _model(tie: bool):
    # 64 / 128-wide rows: every matrix row is a whole number of 32-element quant blocks.
    return make_tiny_hf_model(
        "llama", tie=tie, vocab=VOCAB, hidden=64, intermediate=128, heads=4, kv_heads=2, seed=7
    )


def _theirs(path):
    """transformers' own load of the GGUF file (dequantised float32) and its tokenizer."""
    kw = dict(gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), dtype=torch.float32, **kw
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kw)
    return model, tok


@pytest.mark.parametrize(
    "qtype, tie",
    [("F32", True), ("F32", False), ("F16", True), ("Q8_0", True), ("Q4_0", False), ("Q4_1", True)],
)
def test_import_equals_transformers_gguf_load(tmp_path, bpe, qtype, tie):
    src = _model(tie)
    path = write_tiny_gguf(tmp_path / f"tiny.{qtype}.gguf", src, *bpe, qtype=qtype)
    out = gguf_to_hf_dir(path, tmp_path / "hf")
    ref_model, _ = _theirs(path)
    ref = {k: v.numpy() for k, v in ref_model.state_dict().items()}
    ours = load_file(str(out / "model.safetensors"))
    assert ("lm_head.weight" in ours) == (not tie)
    for name, value in ours.items():
        assert value.dtype == np.float32 and value.shape == ref[name].shape, name
        np.testing.assert_array_equal(value, ref[name], err_msg=name)
    # The quantisation is real (the file is not secretly float32), and the permutation of q/k
    # is undone: the import is close to the float model it came from, not equal.
    orig = src.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy()
    got = ours["model.layers.0.self_attn.q_proj.weight"]
    err = np.abs(got - orig).max()
    assert (err == 0) == (qtype == "F32") and err < 0.1 * np.abs(orig).max(), err
    cfg, params = hf_io.load_hf_checkpoint(out)
    assert cfg.family == "llama" and cfg.tie_word_embeddings == tie
    logits = np.asarray(qwen.forward_jit(params, cfg, TOKENS, qwen.positions_from_mask(MASK), MASK))
    theirs = hf_logits(ref_model, TOKENS, MASK)
    real = MASK > 0
    assert np.abs(theirs[real]).max() > 1.0
    np.testing.assert_allclose(logits[real], theirs[real], atol=1e-4, rtol=0)


def test_mixed_types_like_the_real_file(tmp_path, bpe):
    # SmolLM2-135M-Instruct.Q4_1.gguf: Q8_0 embedding, Q4_1 matrices, F32 norms.
    path = write_tiny_gguf(tmp_path / "m.gguf", _model(True), *bpe, "Q4_1", embed_qtype="Q8_0")
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert kinds["token_embd.weight"] == "Q8_0" and kinds["blk.0.attn_q.weight"] == "Q4_1"
    out = gguf_to_hf_dir(path, tmp_path / "hf")
    ref_model, _ = _theirs(path)
    ours = load_file(str(out / "model.safetensors"))
    for name, value in ours.items():
        np.testing.assert_array_equal(value, ref_model.state_dict()[name].numpy(), err_msg=name)


def _corpus():
    extra = ["\n\n", "  ", "\t\t", " \n \n", "a\n\nb", "x   \t  y", "1234567 + 89"]
    return CORPUS + extra + ["".join(CORPUS)]


def test_tokenizer_equals_transformers_gguf_tokenizer(tmp_path, bpe):
    path = write_tiny_gguf(tmp_path / "t.gguf", _model(True), *bpe, "F32")
    ours = load_tokenizer(gguf_to_hf_dir(path, tmp_path / "hf"))
    _, theirs = _theirs(path)
    for text in _corpus():
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], repr(text)
        assert ours.decode(ours(text)["input_ids"]) == text
    for chat in CHATS:
        a = encode_chat(ours, chat, add_generation_prompt=True)
        b = encode_chat(theirs, chat, add_generation_prompt=True)
        assert a == b and a.count(1) == len(chat) + (chat[0]["role"] != "system") + 1
    assert ours.eos_token == "<|im_end|>" and ours.eos_token_id == 2
    assert ours.convert_tokens_to_ids("<|im_start|>") == 1  # kept whole, not split in pieces


def test_the_corpus_tells_split_rules_apart(tmp_path, bpe):
    # The same vocabulary under Qwen2's split rule tokenizes the corpus differently: the
    # equality above would catch a converter that took the split rule from the model family.
    a = write_tiny_gguf(tmp_path / "a.gguf", _model(True), *bpe, "F32")
    b = write_tiny_gguf(tmp_path / "b.gguf", _model(True), *bpe, "F32", pre="qwen2")
    ta = load_tokenizer(gguf_to_hf_dir(a, tmp_path / "ha"))
    tb = load_tokenizer(gguf_to_hf_dir(b, tmp_path / "hb"))
    _, theirs_b = _theirs(b)
    texts = _corpus()
    assert any(ta(t)["input_ids"] != tb(t)["input_ids"] for t in texts)
    assert all(tb(t)["input_ids"] == theirs_b(t)["input_ids"] for t in texts)


def test_config_json(tmp_path, bpe):
    src = _model(True)
    out = gguf_to_hf_dir(write_tiny_gguf(tmp_path / "c.gguf", src, *bpe), tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads"):
        assert cfg[key] == getattr(src.config, key), key
    assert (cfg["eos_token_id"], cfg["bos_token_id"]) == (2, 1)


def test_errors_name_the_file(tmp_path, bpe):
    with pytest.raises(MissingFileError, match="no such GGUF file"):
        gguf_to_hf_dir(tmp_path / "absent.gguf", tmp_path / "o")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(DataError, match=f"{junk}: not a readable GGUF file"):
        gguf_to_hf_dir(junk, tmp_path / "o")
    q5 = write_tiny_gguf(tmp_path / "q5.gguf", _model(True), *bpe, "Q5_0")
    with pytest.raises(DataError, match=r"q5.gguf: tensor '.*' is Q5_0; supported types"):
        gguf_to_hf_dir(q5, tmp_path / "o")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("o")]
