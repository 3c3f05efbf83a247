"""The training loop end to end on the tiny config: learning, exact resume after SIGKILL,
Ctrl-C, non-finite updates, batching helpers, export.

Every run here compiles the same few programs; the session's persistent compilation cache
(tests/conftest.py), shared with the `launch.py` subprocesses, keeps the module to a few minutes.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers.train_runs import (
    LAUNCH_ARGS,
    ROOT,
    _assert_same_tree,
    _deterministic,
    _final_state,
    _quiet,
    _short_config,
)

from configs import tiny
from dynamo_jax import workdir as run_dir
from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer
from dynamo_jax.config import from_config_dict
from dynamo_jax.errors import CheckpointError
from dynamo_jax.loop import assemble, train
from dynamo_jax.reporting.metrics import read_metrics
from dynamo_jax.reporting.summary import Status
from dynamo_jax.rollout.protocol import Completion

# ----------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_tiny_config_learns(tmp_path, capsys):
    """The README's default run: last 10% of steps ≥ first 10% + 0.5 mean reward (seed 0).

    Measured on 2026-11-22 (this config): per-prompt mean reward 0.05 → 0.80."""
    config = _quiet(tiny.get_config())
    summary = train.run(from_config_dict(config), tmp_path)
    assert summary.status is Status.FINISHED and summary.exit_code == 0
    assert (summary.last_step, summary.checkpoint_step) == (100, 100)
    # The end-of-run summary: reward first → last, the last eval, outputs, export command.
    printed = capsys.readouterr().out
    assert "run tiny_dynamo finished at step 100 of 100\n  reward/mean " in printed
    assert "eval         pass@1 " in printed and "(step 100)" in printed
    assert f"export       python -m dynamo_jax.export {tmp_path} {tmp_path}/hf_step100" in printed
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == list(range(1, config.train.steps + 1))
    # Per-prompt accuracy averaged uniformly over the step's prompts: the rollout-weighted
    # reward/mean would also rise if DynaMO merely sent more rollouts to already-solved prompts.
    rewards = np.asarray([r["reward/prompt_mean"] for r in records])
    tenth = len(rewards) // 10
    first, last = rewards[:tenth].mean(), rewards[-tenth:].mean()
    assert last >= first + 0.5, (first, last)
    for key in ("time/generate", "time/score", "time/old_logprobs", "time/update",
                "time/weight_push", "perf/tokens_per_s", "alloc/n_mean", "alloc/n_hist",
                "reward/zero_var_groups", "temperature", "entropy/mean", "loss/beta_comp_mean",
                "loss/grad_norm"):  # fmt: skip
        assert key in records[-1], key
    # DynaMO's allocation is not uniform once prompts have history.
    assert any(r["alloc/n_min"] < r["alloc/n_max"] for r in records[5:])
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"reward.png", "allocation.png"}


# ----------------------------------------------------------------------------- resume


def _timeline(path):
    """{(event, index): [times]} of a kill_worker timeline file."""
    out = {}
    for line in Path(path).read_text().splitlines():
        e = json.loads(line)
        out.setdefault((e["event"], e["index"]), []).append(e["t"])
    return out


def _last_event(path):
    lines = Path(path).read_text().splitlines() if Path(path).exists() else []
    return json.loads(lines[-1]) if lines else None


def test_metrics_cut_back_when_killed_before_the_first_checkpoint(tmp_path):
    """A run killed before its first checkpoint committed left records of steps it replays."""
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "stale": True}) + "\n" for s in (1, 2, 3))
    )
    train.run(from_config_dict(_short_config(method="grpo", steps=2, every=5)), tmp_path)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert not any("stale" in r for r in records)


def _copy(workdir, tmp_path):
    return Path(shutil.copytree(workdir, tmp_path / "copy"))


def test_damaged_newest_step_is_moved_aside_and_written_again(finished_run, tmp_path):
    """The issue's repro: `rm -rf W/checkpoints/6/meta`, rerun the same command."""
    config, original = finished_run
    workdir = _copy(original, tmp_path)
    shutil.rmtree(workdir / "checkpoints" / "6" / "meta")
    summary = train.run(from_config_dict(config), workdir)
    assert (summary.status, summary.start_step, summary.last_step) == (Status.FINISHED, 3, 6)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [
        "3",
        "6",
        "6.damaged-1",  # kept for inspection
    ]
    assert _deterministic(read_metrics(workdir)) == _deterministic(read_metrics(original))
    _assert_same_tree(_final_state(workdir, config)[1], _final_state(original, config)[1])


def _snapshot(workdir):
    """Every file of the run (not its lock, which each run that takes it rewrites: who holds it)."""
    files = (p for p in workdir.rglob("*") if p.is_file() and p.name != run_dir.LOCK)
    return {p.relative_to(workdir): p.read_bytes() for p in files}


@pytest.mark.slow
def test_checkpoints_that_do_not_fit_are_an_error_and_start_over_moves_them(finished_run, tmp_path):
    config, original = finished_run
    workdir = _copy(original, tmp_path)
    before = _snapshot(workdir)
    wider = _short_config(method="grpo", steps=6, every=3)
    wider.model.num_layers = 3
    with pytest.raises(CheckpointError, match=r"model\.num_layers 2 → 3.*\n.*--start_over"):
        train.run(from_config_dict(wider), workdir)
    assert _snapshot(workdir) == before  # nothing moved, written or cut
    # Allowed by the rule, but the saved optimizer state has another structure (no clipping
    # stage): caught when the step is restored, explained by the config change.
    unclipped = _short_config(method="grpo", steps=6, every=3)
    unclipped.optim.max_grad_norm = 0.0
    with pytest.raises(CheckpointError) as err:
        train.run(from_config_dict(unclipped), workdir)
    first, second = str(err.value).splitlines()
    assert "checkpoints/6: its 'opt_state' item does not fit this run" in first
    assert second.startswith(
        "Config changes since that checkpoint: optim.max_grad_norm 1.0 → 0.0. Rerun with"
    )
    assert _snapshot(workdir) == before

    # Every step damaged: an error (the steps are moved aside), and again on the next rerun.
    for step in (3, 6):
        shutil.rmtree(workdir / "checkpoints" / str(step) / "meta")
    for _ in range(2):
        with pytest.raises(CheckpointError, match="every step is damaged.*3.damaged-1"):
            train.run(from_config_dict(config), workdir)
    assert [r["step"] for r in read_metrics(workdir)] == list(range(1, 7))  # not cut back

    # Asked explicitly: the previous run moves into previous-1 and training starts at step 0.
    shorter = _short_config(method="grpo", steps=2, every=3)
    summary = train.run(from_config_dict(shorter), workdir, start_over=True)
    assert (summary.start_step, summary.last_step, summary.exit_code) == (0, 2, 0)
    previous = workdir / "previous-1"
    assert sorted(p.name for p in previous.iterdir()) == [
        "checkpoints",
        "config.json",
        "metrics.jsonl",
    ]
    assert [r["step"] for r in read_metrics(previous)] == list(range(1, 7))
    assert [r["step"] for r in read_metrics(workdir)] == [1, 2]


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_is_bit_identical(tmp_path, monkeypatch):
    """SIGKILL at 5 moments drawn by a seeded RNG from the uninterrupted run's timeline (during
    compile, mid-step before the first checkpoint, during a save, during the final save, after
    it), each followed by a resume of the same workdir (the next trial, then a last clean
    launch); the final metrics and the whole checkpointed state (parameters, Adam moments,
    counters, data position, allocator history, scheduler) equal the uninterrupted run's."""
    import kill_worker

    steps, every = 6, 3
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    kill_worker.install(tmp_path / "reference.jsonl", "none", monkeypatch.setattr)
    train.run(from_config_dict(_short_config(steps=steps, every=every)), reference)
    seen = _timeline(tmp_path / "reference.jsonl")
    span = lambda a, b, i: seen[(b, i)][0] - seen[(a, i)][0]
    save = min(span("save_begin", "save_end", i) for i in (3, 6))  # the first one compiles

    rng = np.random.default_rng(2026)
    u = rng.random(4)
    plan = [  # (event, index, delay in s): a uniform moment inside the reference's phase
        ("step_begin", 1, u[0] * min(span("step_begin", "step_end", 1), 1.0)),  # compiling
        ("step_begin", 2, u[1] * span("step_begin", "step_end", 2)),  # before any checkpoint
        ("save_begin", 3, u[2] * save),  # writing step 3
        ("save_begin", 6, u[3] * save),  # the final save (after a resume from step 3 or 0)
        ("closed", 0, 0.0),  # after the final save was committed
    ]
    args = [*LAUNCH_ARGS, f"--workdir={killed}", f"--config.train.steps={steps}",
            f"--config.checkpoint.every_steps={every}"]  # fmt: skip
    landed = []
    for trial, (event, index, delay) in enumerate([*plan, (None, 0, 0.0)]):
        log = tmp_path / f"trial{trial}.jsonl"
        kill = "none" if event is None else f"{event}:{index}:{delay:.4f}"
        cmd = [sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(log), kill, *args]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if event is None:
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert f"had already finished at step {steps}" in proc.stdout
        else:
            assert proc.returncode == -signal.SIGKILL, (kill, proc.stderr[-3000:])
            landed.append(f"{kill} → after {_last_event(log)}")

    assert _deterministic(read_metrics(killed)) == _deterministic(read_metrics(reference)), landed
    step_a, params_a, all_a = _final_state(reference, _short_config(steps=steps, every=every))
    step_b, params_b, all_b = _final_state(killed, _short_config(steps=steps, every=every))
    assert step_a == step_b == steps
    _assert_same_tree(params_a, params_b)
    _assert_same_tree(all_a.device, all_b.device)  # parameters, Adam moments, counters, key
    jax.tree.map(np.testing.assert_array_equal, all_a.host, all_b.host)
    # The E3 scheduler moved the temperature, so restoring it was actually exercised.
    assert float(all_a.host["temperature"]["temperature"]) != 1.0


# ----------------------------------------------------------------------------- failures


def test_ctrl_c_checkpoints_and_exits(tmp_path, monkeypatch):
    real_step = train.rl_step

    def step_then_interrupt(tr, step):
        metrics = real_step(tr, step)
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(train, "rl_step", step_then_interrupt)
    config = _short_config(method="grpo", steps=6, every=5)
    summary = train.run(from_config_dict(config), tmp_path)
    assert (summary.status, summary.last_step, summary.checkpoint_step) == (
        Status.INTERRUPTED,
        2,
        2,
    )
    assert summary.exit_code == 3  # INTERRUPTED: checkpointed, resumes with the same command
    ckpt = Checkpointer(tmp_path / "checkpoints", CheckpointConfig())
    assert ckpt.all_steps() == [2]
    ckpt.close()


def test_sigterm_while_building_stops_before_the_first_step(tmp_path, monkeypatch, capfd):
    """SIGTERM while the trainer is still being built (compiling, loading) is honoured, not
    fatal: no step runs, nothing new is checkpointed, the status is INTERRUPTED (3)."""
    real_build = train.build_trainer

    def build_then_terminate(cfg, workdir):
        tr = real_build(cfg, workdir)
        os.kill(os.getpid(), signal.SIGTERM)
        return tr

    monkeypatch.setattr(train, "build_trainer", build_then_terminate)
    previous = signal.getsignal(signal.SIGTERM)
    summary = train.run(from_config_dict(_short_config(method="grpo", steps=2, every=1)), tmp_path)
    assert (summary.status, summary.last_step, summary.checkpoint_step) == (
        Status.INTERRUPTED,
        0,
        None,
    )
    assert summary.exit_code == 3 and summary.reason == "SIGTERM before the first step"
    assert "SIGTERM: finishing the step in flight" in capfd.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is put back
    assert read_metrics(tmp_path) == []


def test_non_finite_updates_are_skipped_then_the_run_stops(tmp_path, monkeypatch, capsys):
    from dynamo_jax.loop import behaviour_pass

    real_old_logprobs = behaviour_pass.old_logprobs

    calls = []

    def poisoned(batch, *args):  # a numerical failure: π_old overflowed from step 2 on
        batch = real_old_logprobs(batch, *args)
        calls.append(1)
        if len(calls) > 1:
            batch = dataclasses.replace(batch, old_logp=np.full_like(batch.old_logp, np.nan))
        return batch

    monkeypatch.setattr(behaviour_pass, "old_logprobs", poisoned)
    config = _short_config(method="grpo", steps=6, every=1)
    config.train.max_consecutive_nonfinite = 3
    summary = train.run(from_config_dict(config), tmp_path)
    records = read_metrics(tmp_path)
    # Step 1 applies its 2 updates; step 2 skips its 2, and the limit of 3 skipped updates in a
    # row is reached at the first update of step 3, which ends the run there: exactly 3 (it
    # stopped after 4, the step's second update, before).
    assert summary.status is Status.NONFINITE and summary.exit_code == 4
    assert summary.last_step == 3 and summary.skipped_updates == 3
    printed = capsys.readouterr().out
    assert (
        "run tiny_grpo stopped: non-finite updates after step 3 of 6: 3 non-finite updates in a "
        "row (limit train.max_consecutive_nonfinite = 3)" in printed
    )
    assert f"checkpoint   {tmp_path}/checkpoints/2\n" in printed
    assert [r["nonfinite/consecutive"] for r in records] == [0, 2, 3]
    assert [r["nonfinite/skipped_in_step"] for r in records] == [0, 2, 1]
    assert [r["train/applied_updates"] for r in records] == [2, 2, 2]
    # Steps 1 and 2 were checkpointed (the skipped updates left finite parameters); the step
    # that hit the limit was not.
    ckpt = Checkpointer(tmp_path / "checkpoints", CheckpointConfig())
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()
    _, params, _ = _final_state(tmp_path, config)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


# ----------------------------------------------------------------------------- helpers


def _completion(pid, tokens, reason="stop"):
    tokens = np.asarray(tokens, np.int32)
    return Completion(pid, 0, tokens, -np.ones(len(tokens), np.float32), reason, 0)


def test_pack_rollouts_layout_and_padding_rows():
    prompts = {7: (5, 6, 7), 9: (8,)}
    batch = assemble.pack_rollouts(
        prompts, [_completion(7, [1, 2]), _completion(9, [3, 4, 5], "length")], rows=3, seq_len=6
    )
    np.testing.assert_array_equal(batch["tokens"][0], [5, 6, 7, 1, 2, 0])
    np.testing.assert_array_equal(batch["loss_mask"][0], [0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(batch["positions"][1][:4], [0, 1, 2, 3])
    np.testing.assert_array_equal(batch["attention_mask"][1], [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch["valid"], [True, True, False])
    np.testing.assert_array_equal(batch["stopped"], [True, False, False])
    assert batch["loss_mask"][2].sum() == 0 and batch["prompt_id"][2] == -1
    with pytest.raises(ValueError, match="prompt 7"):
        assemble.pack_rollouts(prompts, [_completion(7, [1, 2, 3, 4])], rows=1, seq_len=6)


def test_group_stats_by_prompt_id_not_position():
    ids = np.array([4, 9, 4, 9, 9, -1])
    rewards = np.array([1, 0, 0, 0, 0, 0], np.float32)
    valid = np.array([True] * 5 + [False])
    g = assemble.group_stats(ids, rewards, valid)
    np.testing.assert_array_equal(g["prompt_id"], [4, 9])
    np.testing.assert_array_equal(g["count"], [2, 3])
    np.testing.assert_array_equal(g["correct"], [1, 0])
    np.testing.assert_array_equal(g["zero_variance"], [False, True])


def test_prompt_weights_are_one_over_the_step_group_size():
    """prompt-mean's 1/n_i, n_i counted over the whole step batch's rows of the prompt id that
    have a trained token; padding rows and rows without one weigh 0."""
    ids = np.array([4, 9, 4, 9, 9, 7, 9, -1])
    valid = np.array([True] * 7 + [False])
    mask = np.ones((8, 3), np.float32)
    mask[6] = 0.0  # a row of prompt 9 with no trained token: not one of its n_i
    w = assemble.prompt_weights(ids, valid, mask)
    np.testing.assert_allclose(w, [1 / 2, 1 / 3, 1 / 2, 1 / 3, 1 / 3, 1.0, 0.0, 0.0])
    assert w.dtype == np.float32
    # Groups weigh equally: each group's weights sum to 1, the step's to N = 3.
    assert np.isclose(w.sum(), 3.0)


def test_group_stats_entropy_is_the_token_weighted_mean_per_prompt():
    ids = np.array([4, 9, 4, 9, -1])
    valid = np.array([True, True, True, True, False])
    ent = np.array([[0.0, 1.0, 3.0], [0.0, 2.0, 0.0], [0.0, 5.0, 0.0], [7.0, 7.0, 7.0], [9, 9, 9]])
    mask = np.array([[0, 1, 1], [0, 1, 0], [0, 1, 0], [0, 0, 0], [1, 1, 1]], np.float32)
    g = assemble.group_stats(ids, np.zeros(5, np.float32), valid, ent, mask)
    # prompt 4: tokens 1, 3 (row 0) and 5 (row 2) → 9 / 3 = 3; prompt 9: token 2 (row 1), row 3
    # has no trained token → 2 / 1 = 2. The padding row's 9s never count.
    np.testing.assert_allclose(g["entropy_mean"], [3.0, 2.0])
    none = assemble.group_stats(ids[:2], np.zeros(2), valid[:2], ent[:2], np.zeros((2, 3)))
    assert np.isnan(none["entropy_mean"]).all()


def test_the_loop_feeds_each_prompts_entropy_to_the_allocator_history(tmp_path):
    """dynamo_entropy's f(H̄_i) needs H̄_i: after step 1 the history holds the old-log-prob
    pass's per-prompt entropy, so step 2's allocation knows it for the prompts seen before."""
    config = _short_config(method="dynamo_entropy", steps=2, every=2)
    assert train.run(from_config_dict(config), tmp_path).status is Status.FINISHED
    records = read_metrics(tmp_path)
    assert records[0]["alloc/entropy_known_share"] == 0.0
    assert records[1]["alloc/entropy_known_share"] > 0.0
    history = _final_state(tmp_path, config)[2].host["history"]
    known = np.isfinite(history["entropy_mean"])
    assert known.sum() > 0 and (history["entropy_mean"][known] > 0).all()


def test_export_and_evaluation_engine_from_a_run(tmp_path):
    """`python -m dynamo_jax.export` writes what transformers loads; `evaluate.make_engine`
    (what `python -m dynamo_jax.evaluate --checkpoint WORKDIR` uses) serves the run's weights."""
    from dynamo_jax import evaluate, tasks
    from dynamo_jax.export import export
    from dynamo_jax.rollout.protocol import Request, SamplingParams

    config = _short_config(method="grpo", steps=1, every=1)
    train.run(from_config_dict(config), tmp_path / "run")
    _, params, _ = _final_state(tmp_path / "run", config)
    # Export and evaluation read the parameters alone: no optimizer is built or read.
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "1" / "opt_state")
    out = export(tmp_path / "run", tmp_path / "hf", dtype="float32")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["model_type"] == "qwen3" and hf_cfg["vocab_size"] == 32
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    np.testing.assert_allclose(
        model.model.embed_tokens.weight.detach().numpy(),
        np.asarray(params["embed"]["embedding"]),
        rtol=0,
        atol=0,
    )
    cfg = from_config_dict(config)
    engine = evaluate.make_engine(cfg, str(tmp_path / "run"))
    task = tasks.build_task(cfg)
    prompt_id = int(task.prompt_ids[0])
    out = engine.generate(
        [Request(prompt_id, task.prompt_tokens[0], 3)], SamplingParams(max_new_tokens=4, seed=1)
    )
    engine.close()
    task.close()
    assert [c.prompt_id for c in out] == [prompt_id] * 3
    assert all(1 <= len(c.token_ids) <= 4 for c in out)
