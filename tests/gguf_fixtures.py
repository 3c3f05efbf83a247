"""Small Llama GGUF files for tests, written with the `gguf` package's own writer and quantisers.

`write_tiny_gguf` takes a transformers LlamaForCausalLM (tests/hf_fixtures.py) and a trained
byte-level BPE, and writes them the way llama.cpp's converter does: q/k rows permuted per head,
1-D tensors in F32, every matrix in the chosen type, the tokenizer as tokenizer.ggml.* keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

# A corpus with the whitespace runs split rules disagree on ("\n\n", runs of spaces, tabs).
CORPUS = [
    "What is 12 + 345?\n\nThe answer is 357.",
    "  two spaces,   three spaces,\ttab,\t\ttwo tabs.\n",
    "Tom has 7 apples.\n\n\nHe gives 3 away.  How many are left?\n \n",
    "def f(x):\n    return x * 2\n\n\n# done\t \t",
]
SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_bpe(vocab_size: int = 384) -> tuple[list[str], list[str]]:
    """(tokens by id, merges "a b") of a byte-level BPE trained on CORPUS (specials at 0, 1, 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS * 50, trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: rotate-half → interleaved pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_tiny_gguf(
    path: Path,
    model,
    tokens: list[str],
    merges: list[str],
    qtype: str = "F32",
    *,
    pre: str = "smollm",
    embed_qtype: str | None = None,
) -> Path:
    """Write `model` (transformers LlamaForCausalLM) and the BPE to the GGUF file `path`."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.head_dim)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(SYSTEM_TEMPLATE)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    for name, arr in sd.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, rest = name.split(".", 3)[2:]
            gname = f"blk.{layer}.{_NAMES[rest]}"
        if rest_is(name, "q_proj"):
            arr = llama_cpp_permute(arr, c.num_attention_heads)
        elif rest_is(name, "k_proj"):
            arr = llama_cpp_permute(arr, c.num_key_value_heads)
        kind = (embed_qtype or qtype) if gname == "token_embd.weight" else qtype
        if arr.ndim == 1 or kind == "F32":
            w.add_tensor(gname, arr)
        else:
            t = gguf.GGMLQuantizationType[kind]
            w.add_tensor(gname, gguf.quants.quantize(arr, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rest_is(name: str, proj: str) -> bool:
    return name.endswith(f"self_attn.{proj}.weight")
