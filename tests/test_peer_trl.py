"""The parts of benchmarks/peer_trl.py that run without the TRL venv.

Oracles: the project's own synthetic verdict (dynamo_jax.data.synthetic) for the TRL side's
re-implemented reward, on every 1- and 2-token completion of the task's vocabulary; the
project's config values for the settings map; the project's parameters and its own JAX forward
for the exported HF directory, read back by the project and by HF transformers (PyTorch).
"""

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peer_trl  # noqa: E402
from benchmarks.peer_trl_worker import synthetic_reward, synthetic_status  # noqa: E402
from dynamo_jax.config import from_config_dict  # noqa: E402
from dynamo_jax.data.synthetic import (  # noqa: E402
    MAX_RESPONSE_CHARS,
    VOCAB,
    synthetic_tokenizer,
    synthetic_verdict,
)
from dynamo_jax.rewards.config import RewardConfig  # noqa: E402


def _run_cfg(shape="tiny", **changes):
    config, force = peer_trl.shape_config(shape, seed=3, steps=10)
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        config[section][key] = value
    return from_config_dict(config), force


# ----------------------------------------------------------------------------- reward


def _texts() -> list[str]:
    """Every 1- and 2-token completion, decoded as both sides decode (specials skipped) and with
    the specials kept, plus the edge cases of the verdict's rules."""
    tok = synthetic_tokenizer()
    ids = [[a] for a in range(len(VOCAB))] + [[a, b] for a in range(32) for b in range(32)]
    texts = set()
    for seq in ids:
        texts.add(tok.decode(seq, skip_special_tokens=True))
        texts.add(tok.decode(seq, skip_special_tokens=False))
    texts |= {"", " 3", "\n3 +", "23", "+2", "3<|im_end|>4", "<|endoftext|>3", "<|im_start|>4",
              "<|im_end|>3", "3" + "x" * (MAX_RESPONSE_CHARS - 1), "3" + "x" * MAX_RESPONSE_CHARS,
              "٣"}  # fmt: skip
    return sorted(texts)


def test_reward_equals_the_projects_verdict_on_every_short_completion():
    # Distinct rewards per status, so a status mix-up changes the reward.
    cfg = RewardConfig(correct_reward=1.0, wrong_reward=-0.25, no_answer_reward=-1.0)
    values = peer_trl.reward_values(cfg)
    assert values["correct"] == 1.0 and values["wrong"] == -0.25 and values["no_answer"] == -1.0
    texts = _texts()
    assert len(texts) > 500
    compared = 0
    for text in texts:
        for gold in ("0", "3", "4"):
            want = synthetic_verdict(text, gold, cfg)
            status = synthetic_status(text, gold, MAX_RESPONSE_CHARS)
            assert status == want.status, (text, gold)
            assert synthetic_reward(text, gold, values, MAX_RESPONSE_CHARS) == want.reward
            compared += 1
    statuses = {synthetic_status(t, "3", MAX_RESPONSE_CHARS) for t in texts}
    assert statuses == {"correct", "wrong", "no_answer", "parse_error"}  # every branch reached
    assert compared == 3 * len(texts)
    assert synthetic_status(None, "3", MAX_RESPONSE_CHARS) == synthetic_verdict(None, "3").status


# ----------------------------------------------------------------------------- settings map


def test_settings_map_the_tiny_grpo_run_one_to_one():
    cfg, force = _run_cfg()
    assert not force
    rows, kw = peer_trl.trl_settings(cfg, force_length=force)
    # 16 prompts x 8 = 128 per step in mini-batches of 64: 2 updates per generation
    assert kw["per_device_train_batch_size"] == 64 and kw["gradient_accumulation_steps"] == 1
    assert kw["steps_per_generation"] == 2 and kw["num_generations"] == 8
    assert kw["num_iterations"] == 1 and kw["max_steps"] == 20  # 10 RL steps x 2 updates
    assert kw["loss_type"] == "bnpo" and kw["beta"] == 0.0 and kw["scale_rewards"] == "group"
    assert kw["epsilon"] == kw["epsilon_high"] == 0.2
    assert kw["learning_rate"] == 1e-3 and kw["weight_decay"] == 0.01
    assert (kw["adam_beta1"], kw["adam_beta2"], kw["adam_epsilon"]) == (0.9, 0.999, 1e-8)
    assert kw["max_grad_norm"] == 1.0 and kw["lr_scheduler_type"] == "constant"
    assert kw["gradient_checkpointing"] is False  # TRL's default is True: not the same work
    assert kw["max_completion_length"] == 4 and kw["temperature"] == 1.0
    assert kw["top_p"] == 1.0 and kw["top_k"] == 0  # the project's -1 (off) is TRL's 0 (off)
    assert kw["seed"] == kw["data_seed"] == 3
    assert not kw["bf16"] and not kw["fp16"] and "generation_kwargs" not in kw
    assert all(len(row) == 4 and all(isinstance(c, str) for c in row) for row in rows)
    assert ("loss.variant / loss_agg_mode", "grpo / token-mean", "loss_type", "bnpo") in rows


def test_settings_of_the_small_shape_force_the_length():
    cfg, force = _run_cfg("small")
    assert force and cfg.rollout.max_new_tokens == 32 and cfg.model.hidden_size == 256
    assert cfg.model.vocab_size == len(VOCAB)
    _, kw = peer_trl.trl_settings(cfg, force_length=force)
    assert kw["generation_kwargs"] == {"eos_token_id": None}
    assert kw["max_completion_length"] == 32


def test_the_task_reaches_the_shape_config():
    assert peer_trl.shape_config("tiny", 3, 10)[0].data.synthetic_op == "max"
    config, force = peer_trl.shape_config("small", 3, 10, task="mixed")
    assert config.data.synthetic_op == "mixed" and force


@pytest.mark.parametrize("source", ["engine", "trainer"])
def test_the_old_logprobs_setting_reaches_the_run_and_the_table(source):
    config, force = peer_trl.shape_config("small", 3, 10, old_logprobs=source)
    cfg = from_config_dict(config)
    assert cfg.train.old_logp_source == source and cfg.updates_per_step == 2
    assert (cfg.old_logp_from_engine_only, cfg.first_update_on_policy) == (
        source == "engine",
        source == "trainer",
    )
    rows, _ = peer_trl.trl_settings(cfg, force_length=force)
    (row,) = [r for r in rows if r[0].startswith("old log-probs")]
    want = "engine's sampling log-probs" if source == "engine" else "rows of updates 2.."
    assert want in row[1] and row[3] == "every row"


def test_settings_of_the_smollm2_shape_are_the_real_model_run_in_one_batch():
    from dynamo_jax.config import from_config_dict

    cfg = from_config_dict(peer_trl.smollm2_config())
    assert cfg.model.hidden_size == 576 and cfg.train.micro_batches == 1
    _, kw = peer_trl.trl_settings(cfg, force_length=False)
    # 8 prompts x 8 = 64 a step, one update on-policy: neither side runs a behaviour pass
    assert kw["per_device_train_batch_size"] == 64 and kw["steps_per_generation"] == 1
    assert kw["num_iterations"] == 1 and cfg.skips_logprob_pass
    assert kw["temperature"] == 0.7 and kw["max_completion_length"] == 16
    assert kw["learning_rate"] == 2e-5 and "generation_kwargs" not in kw


@pytest.mark.parametrize(
    "changes, word",
    [
        ({"train__micro_batches": 2}, "micro-batches"),
        ({"loss__kl": "k1"}, "loss.kl"),
        ({"loss__dual_clip": 3.0}, "dual_clip"),
        ({"loss__variant": "clip_higher"}, "variant"),
        ({"optim__schedule": "cosine"}, "schedule"),
    ],
)
def test_settings_refuse_what_trl_cannot_run(changes, word):
    cfg, force = _run_cfg(**changes)
    with pytest.raises(ValueError, match=word):
        peer_trl.trl_settings(cfg, force_length=force)


def test_settings_refuse_a_non_uniform_allocation():
    from configs import tiny

    cfg = from_config_dict(tiny.get_config("method=dynamo"))
    with pytest.raises(ValueError, match="allocation.policy"):
        peer_trl.trl_settings(cfg, force_length=False)


# ----------------------------------------------------------------------------- export


def test_export_round_trip_and_the_same_prompts_for_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dynamo_jax.models.hf_io import load_hf_checkpoint
    from dynamo_jax.models.qwen import forward, init_params

    cfg, _ = _run_cfg()
    params = init_params(cfg.model, jax.random.key(0))
    out = peer_trl.export_init(params, cfg, tmp_path / "hf")
    _, back = load_hf_checkpoint(out, cfg=cfg.model)
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), params, back)
    assert all(jax.tree.leaves(same))  # float32 export: bit-exact

    rows = peer_trl.task_rows(cfg)
    assert len(rows) == 25 and all(r["gold"] in "01234" for r in rows)
    json.dumps(rows)  # the spec is JSON
    tok = AutoTokenizer.from_pretrained(out)
    for row in rows:  # what the TRL worker checks before it trains
        ids = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert list(ids) == row["prompt_ids"]

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = np.asarray([rows[0]["prompt_ids"]], np.int32)
    positions = np.arange(tokens.shape[1], dtype=np.int32)[None]
    want = np.asarray(forward(params, cfg.model, tokens, positions, np.ones_like(tokens)))
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_phase_medians_take_other_as_the_rest_of_the_step():
    steps = [
        {"generate": 1.0, "score": 0.1, "old_logprobs": 0.2, "update": 2.0, "step": 4.0},
        {"generate": 3.0, "score": 0.1, "old_logprobs": 0.4, "update": 2.0, "step": 6.0},
        {"generate": 2.0, "score": 0.1, "old_logprobs": 0.3, "update": 4.0, "step": 7.0},
    ]
    med = peer_trl.phase_medians(steps)
    assert med["generate"] == 2.0 and med["update"] == 2.0 and med["step"] == 6.0
    # other per step: 0.7, 0.5, 0.6 -> median 0.6
    assert med["other"] == pytest.approx(0.6)


def test_score_requests_are_answered_by_the_scorer_worker(tmp_path):
    """TRL's reward function (here a stand-in) asks for scores mid-round; the driver passes the
    request to the project worker (a stand-in scorer) and writes its rewards back."""
    prefix = peer_trl.PREFIX
    trl_side = (
        "import json, sys\n"
        "sys.stdin.readline()\n"  # go 1
        "print('a TRL log line that is not an answer', flush=True)\n"
        f"print({prefix!r} + json.dumps({{'score': {{'texts': ['3', 'x'], 'golds': ['3', '3']}}}}),"
        " flush=True)\n"
        "rewards = json.loads(sys.stdin.readline())\n"
        f"print({prefix!r} + json.dumps({{'steps': [{{'reward': sum(rewards)}}]}}), flush=True)\n"
    )
    scorer_side = (
        "import json, sys\n"
        "words = sys.stdin.readline().split(' ', 1)\n"
        "asked = json.loads(words[1])\n"
        "rewards = [float(t == g) for t, g in zip(asked['texts'], asked['golds'])]\n"
        f"print({prefix!r} + json.dumps({{'rewards': rewards}}), flush=True)\n"
    )
    env = dict(__import__("os").environ)
    trl = peer_trl.Worker("TRL", [sys.executable, "-c", trl_side], env, tmp_path / "t.log")
    project = peer_trl.Worker(
        "project", [sys.executable, "-c", scorer_side], env, tmp_path / "p.log"
    )
    try:
        assert trl.go(1, scorer=project) == {"steps": [{"reward": 1.0}]}
    finally:
        trl.stop()
        project.stop()
