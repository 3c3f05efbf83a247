"""Qwen2/Qwen2.5 and Qwen3 decoders in Flax: config, presets, forward, KV-cache decode, HF I/O,
tokenizers. Import from the submodules (config, presets, qwen, decode, hf_io, tokenizer)."""
