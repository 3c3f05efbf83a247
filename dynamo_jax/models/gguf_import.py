"""A Llama GGUF file (llama.cpp's format) → a local Hugging Face model directory.

`gguf_to_hf_dir(gguf_file, out_dir)` writes what `hf_io.load_hf_checkpoint` and
`tokenizer.load_tokenizer` read: config.json (LlamaForCausalLM), model.safetensors (every tensor
dequantised to float32) and tokenizer.json / tokenizer_config.json built from the GGUF's own
vocabulary, merges, special tokens and chat template. The file is read with the `gguf` package
(llama.cpp's reference reader); F32, F16, BF16, Q8_0, Q4_0 and Q4_1 tensors are accepted.

Two things a GGUF does differently from the HF checkpoint it was converted from:
- llama.cpp's converter permutes the rows of q_proj/k_proj within each head (interleaved RoPE
  pairs instead of HF's rotate-half halves); `_unpermute` undoes it.
- It carries no tokenizer.json. The tokenizer is rebuilt as transformers does when it loads the
  same GGUF (the oracle in the tests): a byte-level BPE with the GPT-2 split rule unless
  `tokenizer.ggml.pre` names one of the split rules below. It is NOT taken from the model family:
  a Qwen2 config, for one, would bring Qwen2's split rule, which cuts whitespace runs differently.

A file this module cannot convert is a `DataError` naming it and the offending key or tensor.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from dynamo_jax.errors import DataError, MissingFileError

# The tensor types converted (others raise): plain floats and the classic block quantisations.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# tokenizer.ggml.pre values whose split rule is not GPT-2's (the same rules transformers applies
# to these names); every other value gets the GPT-2 rule of a plain byte-level BPE.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


class _Gguf:
    """The metadata and tensors of one GGUF file (memory-mapped; nothing is read twice)."""

    def __init__(self, path: Path):
        import gguf

        if not path.is_file():
            raise MissingFileError(f"{path}: no such GGUF file")
        try:
            self.reader = gguf.GGUFReader(str(path))
        except Exception as exc:  # the reader's own errors do not name the file
            raise DataError(f"{path}: not a readable GGUF file ({exc})") from None
        self.path = path
        self.arch = _field(self.reader, "general.architecture")
        if self.arch != "llama":
            raise DataError(
                f"{path}: general.architecture is {self.arch!r}; only 'llama' GGUF files convert"
            )
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return _field(self.reader, key, default)

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise DataError(f"{self.path}: metadata key {key!r} is missing")
        return value

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as float32 in HF layout ([out, in] for matrices)."""
        import gguf

        t = self.tensors.get(name)
        if t is None:
            raise DataError(f"{self.path}: tensor {name!r} is missing")
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise DataError(
                f"{self.path}: tensor {name!r} is {kind}; supported types: {SUPPORTED_TYPES}"
            )
        out = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
        return np.ascontiguousarray(out.reshape(shape))


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head row order of q/k_proj: (pairs, 2) back to (2, halves)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_config(g: _Gguf) -> dict[str, Any]:
    """The LlamaForCausalLM config.json of the model in `g`."""
    a = g.arch
    hidden = int(g.need(f"{a}.embedding_length"))
    heads = int(g.need(f"{a}.attention.head_count"))
    kv_heads = int(g.get(f"{a}.attention.head_count_kv", heads))
    head_dim = int(g.get(f"{a}.attention.key_length", hidden // heads))
    rope_dim = int(g.get(f"{a}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise DataError(f"{g.path}: partial RoPE ({rope_dim} of {head_dim} dims) is unsupported")
    scaling = g.get(f"{a}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise DataError(f"{g.path}: {a}.rope.scaling.type {scaling!r} is unsupported")
    tokens = g.need("tokenizer.ggml.tokens")
    theta = float(g.get(f"{a}.rope.freq_base", 10000.0))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(g.get(f"{a}.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(g.need(f"{a}.feed_forward_length")),
        "num_hidden_layers": int(g.need(f"{a}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(g.get(f"{a}.context_length", 2048)),
        "rms_norm_eps": float(g.need(f"{a}.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "rope_theta": theta,
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "dtype": "float32",
    }
    for key in ("bos", "eos", "padding"):
        token_id = g.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            cfg[f"{'pad' if key == 'padding' else key}_token_id"] = int(token_id)
    return cfg


def hf_tensors(g: _Gguf, cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """{HF name: float32 array} for every tensor of the model."""
    out: dict[str, np.ndarray] = {}
    for name in g.tensors:
        if name in _TOP_NAMES:
            hf_name = _TOP_NAMES[name]
        elif name.startswith("blk.") and name.split(".", 2)[2] in _LAYER_NAMES:
            layer, rest = name.split(".", 2)[1:]
            hf_name = f"model.layers.{int(layer)}.{_LAYER_NAMES[rest]}"
        elif name == "rope_freqs.weight":
            raise DataError(f"{g.path}: rope_freqs (scaled RoPE) is unsupported")
        else:
            raise DataError(f"{g.path}: unexpected tensor {name!r} in a llama GGUF")
        w = g.tensor(name)
        if hf_name.endswith("q_proj.weight"):
            w = _unpermute(w, cfg["num_attention_heads"])
        elif hf_name.endswith("k_proj.weight"):
            w = _unpermute(w, cfg["num_key_value_heads"])
        out[hf_name] = w
    return out


def hf_tokenizer(g: _Gguf):
    """(tokenizers.Tokenizer, tokenizer_config dict) rebuilt from the GGUF's tokenizer keys."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    model = g.need("tokenizer.ggml.model")
    if model != "gpt2":
        raise DataError(
            f"{g.path}: tokenizer.ggml.model {model!r} is unsupported (only byte-level BPE 'gpt2')"
        )
    tokens = list(g.need("tokenizer.ggml.tokens"))
    types = list(g.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ")) for m in g.need("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    split = _PRE_SPLITS.get(g.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, ...) and user-defined ones are matched whole in the text; a
    # control token spelled outside the byte alphabet is a llama.cpp mislabel and stays a
    # plain vocabulary entry, as in transformers.
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, k in zip(tokens, types)
            if k == _CONTROL and set(t) <= alphabet
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, k in zip(tokens, types)
            if k == _USER_DEFINED
        ]
    )

    def token(key: str) -> str | None:
        i = g.get(f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[int(i)]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "add_bos_token": bool(g.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(g.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": hf_config(g)["max_position_embeddings"],
    }
    if config["add_bos_token"] or config["add_eos_token"]:
        raise DataError(
            f"{g.path}: tokenizer.ggml.add_bos/eos_token=true is unsupported (chat templates here "
            "write every special token themselves)"
        )
    template = g.get("tokenizer.chat_template")
    if template is None:
        raise DataError(f"{g.path}: no tokenizer.chat_template (an instruct model needs one)")
    config["chat_template"] = template
    return tok, config


def gguf_to_hf_dir(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Convert `gguf_file` into the HF directory `out_dir` (written whole, then renamed in)."""
    from safetensors.numpy import save_file

    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    g = _Gguf(gguf_file)
    cfg = hf_config(g)
    tok, tok_config = hf_tokenizer(g)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
        save_file(hf_tensors(g, cfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed conversion leaves nothing behind
    return out_dir
