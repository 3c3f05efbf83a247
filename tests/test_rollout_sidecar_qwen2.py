"""The sidecar driven like the trainer drives it: Flax params, `update_weights(params, version)`.

Tiny UNtied Qwen2 (q/k/v biases, a separate lm_head), so the push exercises the parts of the HF
mapping the tied Qwen3 module does not. Oracles: the embedded JAX engine on the same params, and
transformers' `generate`; log-probs against the trainer's own Flax forward.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_fixtures import make_tiny_hf_checkpoint, make_tiny_hf_model

from dynamo_jax.models import hf_io, qwen
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig
from dynamo_jax.rollout.protocol import Request, SamplingParams
from dynamo_jax.rollout.sidecar_client import SidecarConfig, VLLMSidecarEngine

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not Path(VLLM_PYTHON).is_file(),
        reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
    ),
]
SHAPE = dict(hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256, seed=3)  # head_dim 32
PROMPTS = [(5, 6, 7, 8), (9, 10, 11, 12, 13, 14, 15), (200, 3), (17,)]
NEW = 12


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecar_qwen2")
    ckpt = make_tiny_hf_checkpoint(root, "qwen2", tie=False, **SHAPE)
    cfg, params = hf_io.load_hf_checkpoint(ckpt)
    config = SidecarConfig(
        python=VLLM_PYTHON, model_path=str(ckpt), dtype="float32", max_model_len=256,
        enforce_eager=True, startup_timeout_s=600, call_timeout_s=120, max_num_seqs=32,
    )  # fmt: skip
    sidecar = VLLMSidecarEngine(config, model_cfg=cfg, workdir=root / "work")
    embedded = JaxEngine(cfg, params, JaxEngineConfig(min_batch=4, max_batch=8, min_new_tokens=NEW))
    yield sidecar, embedded, cfg, params
    sidecar.close()
    embedded.close()


def greedy(engine) -> list[list[int]]:
    requests = [Request(i, p, 1) for i, p in enumerate(PROMPTS)]
    out = engine.generate(requests, SamplingParams(max_new_tokens=NEW, temperature=0.0))
    return [c.token_ids.tolist() for c in out], {c.weight_version for c in out}


def test_greedy_equals_embedded_engine_and_transformers(setup):
    import torch

    sidecar, embedded, _, _ = setup
    tokens, versions = greedy(sidecar)
    assert versions == {0}
    assert tokens == greedy(embedded)[0]
    model = make_tiny_hf_model("qwen2", tie=False, **SHAPE)
    for prompt, got in zip(PROMPTS, tokens):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )  # fmt: skip
        assert got == out[0, len(prompt) :].tolist()


def test_update_weights_from_params_matches_embedded_and_restores(setup):
    sidecar, embedded, _, params = setup
    before, _ = greedy(sidecar)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    # A change like an optimizer step's: every tensor moves, lm_head and biases included.
    stepped = jax.tree.unflatten(
        treedef,
        [
            x + 0.3 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys)
        ],
    )
    base = sidecar.weight_version
    sidecar.update_weights(stepped, base + 1)
    embedded.update_weights(stepped, base + 1)
    after, versions = greedy(sidecar)
    assert versions == {base + 1} and sidecar.weight_version == base + 1
    assert after == greedy(embedded)[0]
    assert after != before
    push = sidecar.last_push
    expected_bytes = sum(x.size * 4 for x in leaves)
    assert expected_bytes <= push.nbytes < expected_bytes + 65536  # payload + safetensors header
    print(
        f"tiny qwen2 push: export {push.export_s * 1e3:.1f} ms, reload {push.reload_s * 1e3:.1f} ms"
    )
    sidecar.update_weights(params, base + 2)
    embedded.update_weights(params, base + 2)
    restored, versions = greedy(sidecar)
    assert restored == before and versions == {base + 2}


def test_logprobs_match_the_trainers_forward(setup):
    sidecar, _, cfg, params = setup
    temperature = 0.8
    requests = [Request(i, p, 3) for i, p in enumerate(PROMPTS)]
    out = sidecar.generate(
        requests, SamplingParams(max_new_tokens=NEW, temperature=temperature, seed=2)
    )
    width = max(len(PROMPTS[c.prompt_id]) + len(c.token_ids) for c in out)
    tokens = np.zeros((len(out), width), np.int32)
    mask = np.zeros((len(out), width), np.int32)
    for row, c in enumerate(out):
        seq = list(PROMPTS[c.prompt_id]) + c.token_ids.tolist()
        tokens[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    logits = qwen.forward(params, cfg, tokens, qwen.positions_from_mask(jnp.asarray(mask)), mask)
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1))
    worst = 0.0
    for row, c in enumerate(out):
        p = len(PROMPTS[c.prompt_id])
        mine = logp[row, p - 1 + np.arange(len(c.token_ids)), c.token_ids]
        worst = max(worst, float(np.abs(mine - c.logprobs).max()))
    # Measured here ~1e-6 (both float32 on CPU); on GPU in bfloat16 expect ~1e-2.
    print(f"max |vLLM logprob - Flax log pi| at T={temperature}: {worst:.2e}")
    assert worst < 1e-4
