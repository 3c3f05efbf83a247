"""The sidecar server's op handlers around a stand-in `vllm.LLM` that records its calls.

vLLM has no sleep mode on CPU (it refuses `enable_sleep_mode`), so the order of sleep and wake
calls around generate, reload and read-back is checked here against a recording LLM; the real
sleep mode is checked on a GPU (docs/vllm_sidecar.md has the command).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dynamo_jax.rollout import sidecar_server, weight_push


class RecordingLLM:
    """The parts of vllm.LLM the server uses; every call is appended to `calls`."""

    def __init__(self):
        self.calls = []
        hf_config = types.SimpleNamespace(tie_word_embeddings=False)
        self.llm_engine = types.SimpleNamespace(
            model_config=types.SimpleNamespace(hf_config=hf_config)
        )

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", len(prompts)))
        sample = types.SimpleNamespace(
            index=0,
            token_ids=[3],
            logprobs=[{3: types.SimpleNamespace(logprob=-0.5)}],
            finish_reason="length",
        )
        return [types.SimpleNamespace(outputs=[sample] * p.n) for p in params]

    def collective_rpc(self, method, args=(), kwargs=None):
        self.calls.append(("rpc", method if isinstance(method, str) else method.__name__))
        return [{"rank": 0, "tensors": {}}]

    def reset_prefix_cache(self):
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` module with the two classes generate builds (the trainer venv has no vLLM)."""

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def _sidecar(tmp_path, level):
    push = weight_push.write_push_dir(
        {"model.norm.weight": np.ones(4, np.float32)}, str(tmp_path), 0
    )
    llm = RecordingLLM()
    return sidecar_server.Sidecar({"model": str(push.directory)}, sleep_level=level, llm=llm), push


GENERATE = {
    "op": "generate",
    "requests": [{"prompt_id": 1, "prompt_token_ids": [5, 6], "n": 2}],
    "sampling": {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 1,
        "stop_token_ids": [], "seed": 0,
    },
}  # fmt: skip


def _step(sidecar, push):
    """What the trainer asks of a sidecar over two steps: generate, push, verify, generate."""
    first = sidecar.generate(GENERATE)
    sidecar.update_weights({"path": str(push.directory), "version": 1})
    sidecar.fingerprint({"names": ["model.norm.weight"]})
    second = sidecar.generate(GENERATE)
    assert [len(r) for r in first["results"] + second["results"]] == [2, 2]
    assert second["weight_version"] == 1


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_after_generate_wake_weights_to_reload_and_kv_cache_to_generate(
    fake_vllm, tmp_path, level
):
    sidecar, push = _sidecar(tmp_path, level)
    _step(sidecar, push)
    assert sidecar.llm.calls == [
        ("generate", 1),
        ("sleep", level),  # training gets the memory
        ("wake_up", ("weights",)),  # the reload needs resident weights (level 2: new pages)
        ("rpc", "reload_weights"),
        ("rpc", "read_fingerprints"),  # still awake: no second wake
        ("wake_up", ("kv_cache",)),
        ("generate", 1),
        ("sleep", level),
    ]


def test_sleep_level_0_never_sleeps(fake_vllm, tmp_path):
    sidecar, push = _sidecar(tmp_path, 0)
    _step(sidecar, push)
    assert [c[0] for c in sidecar.llm.calls] == ["generate", "rpc", "rpc", "generate"]


def test_fingerprint_of_an_unknown_tensor_is_refused(tmp_path):
    sidecar, _ = _sidecar(tmp_path, 0)
    with pytest.raises(ValueError, match=r"no tensor named \['lm_head.weight'\]"):
        sidecar.fingerprint({"names": ["lm_head.weight"]})
