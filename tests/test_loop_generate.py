"""The rollout stage on the tiny task without a model: what a request fixes, the one round
without dynamic sampling, and dynamic sampling's rounds, with a scripted engine whose right and
wrong answers are known, through the loop's own pipeline."""

import dataclasses

import numpy as np
import pytest

from configs import tiny
from dynamo_jax import data, tasks
from dynamo_jax.allocation import make_allocator, make_history
from dynamo_jax.config import from_config_dict
from dynamo_jax.loop import assemble
from dynamo_jax.loop.generate import Planner, generate
from dynamo_jax.rollout.pipeline import RolloutPipeline, StaleBatchError
from dynamo_jax.rollout.protocol import Completion
from dynamo_jax.seeds import ROLLOUT, step_seed
from dynamo_jax.temperature import TemperatureScheduler


@pytest.fixture(scope="module")
def setup():
    cfg = from_config_dict(tiny.get_config("method=grpo_dynamic_sampling"))
    task = tasks.build_task(cfg)
    yield cfg, task
    task.close()


def _stages(cfg, task):
    history = make_history(cfg.allocation, task.num_prompts)
    scheduler = TemperatureScheduler(cfg.temperature)
    data_iter = task.iterator(cfg.data.seed, cfg.train.prompts_per_step)
    allocator = make_allocator(cfg.allocation)
    return data_iter, allocator, history, scheduler


def test_a_request_fixes_prompts_counts_temperature_seed_and_version(setup):
    cfg, task = setup
    data_iter, allocator, history, scheduler = _stages(cfg, task)
    scheduler.temperature = 0.83  # what E3's scheduler would have set by now
    planner = Planner(cfg, task, data_iter, allocator, history, scheduler)
    plan = planner.request(7, 5)
    rows = next(task.iterator(cfg.data.seed, cfg.train.prompts_per_step)).indices
    np.testing.assert_array_equal(plan.rows, rows)
    np.testing.assert_array_equal(plan.allocation.n, allocator.allocate(rows, history, 128).n)
    assert [r.prompt_id for r in plan.requests] == [int(task.prompt_ids[r]) for r in rows]
    assert [r.n for r in plan.requests] == [8] * 16
    assert plan.sampling.temperature == 0.83 and plan.version == 5 and plan.step == 7
    assert plan.sampling.seed == step_seed(cfg.train.seed, 7, ROLLOUT)
    later = planner.request(7, 5, round_=2)
    assert later.sampling.seed == step_seed(cfg.train.seed, 7, ROLLOUT, 2) != plan.sampling.seed


class ScriptedEngine:
    """Answers right on every sample of prompts whose id is in `solved`, right on sample 0 only
    of the others (a group with a reward signal)."""

    weight_version = 2  # what the trainer pushed at the end of step 2

    def __init__(self, task, solved):
        tok = data.synthetic_tokenizer()
        self.encode = lambda text: tok.encode(text, add_special_tokens=False)
        self.answer = dict(zip(task.prompt_ids.tolist(), task.answers))
        self.stop = task.stop_token_ids[0]
        self.solved = solved
        self.seeds = []

    def generate(self, requests, sampling):
        self.seeds.append(sampling.seed)
        out = []
        for r in requests:
            gold = self.answer[r.prompt_id]
            for i in range(r.n):
                right = r.prompt_id in self.solved or i == 0
                text = gold if right else str((int(gold) + 1) % 10)
                ids = np.asarray(self.encode(text) + [self.stop], np.int32)
                out.append(
                    Completion(
                        r.prompt_id,
                        i,
                        ids,
                        np.zeros(len(ids), np.float32),
                        "stop",
                        self.weight_version,
                    )
                )
        return out


def _pipeline(engine, last_step=10):
    return RolloutPipeline(engine, max_staleness=0, last_step=last_step, source="trainer")


def test_dynamic_sampling_rounds_fill_the_batch_with_groups_that_have_a_signal(setup):
    cfg, task = setup
    data_iter, allocator, history, scheduler = _stages(cfg, task)
    solved = set(task.prompt_ids[::4].tolist())  # 7 of the 25 problems: all rewards 1
    engine = ScriptedEngine(task, solved)

    planner = Planner(cfg, task, data_iter, allocator, history, scheduler)
    out = generate(_pipeline(engine), 3, planner, None)
    # The oracle: walk the same data order (rounds of 16 rows), keep unsolved prompts once each,
    # in order, until 16 (uniform n = 8: every kept group fits, 16 x 8 = 128 rows).
    order = task.iterator(cfg.data.seed, cfg.train.prompts_per_step)
    kept, rounds = [], 0
    while len(kept) < 16:  # 18 unsolved problems: ends
        rounds += 1
        for r in next(order).indices:
            pid = int(task.prompt_ids[r])
            if pid not in solved and pid not in kept and len(kept) < 16:
                kept.append(pid)
    ids = [c.prompt_id for c in out.rollouts.completions]
    assert ids == [pid for pid in kept for _ in range(8)]
    assert len(engine.seeds) == rounds >= 2 and len(set(engine.seeds)) == rounds
    assert engine.seeds[0] == step_seed(cfg.train.seed, 3, ROLLOUT)
    np.testing.assert_array_equal(out.rewards, np.tile([1] + [0] * 7, 16).astype(np.float32))
    assert out.metrics["dynamic/rounds"] == rounds and out.metrics["dynamic/kept_groups"] == 16
    assert out.metrics["dynamic/rollouts_generated"] == 128 * rounds
    # Every round's groups are there for the history, solved ones included.
    assert [len(g["prompt_id"]) for _, _, g in out.drawn.parts] == [16] * rounds
    assert sum(int(g["count"].sum()) for _, _, g in out.drawn.parts) == 128 * rounds
    assert history.total_generated.sum() == 0  # recording is the record stage's job
    # Every round's generation and scoring, summed
    assert sorted(out.timings) == ["time/generate", "time/score"]
    assert 0 < out.timings["time/score"] and 0 <= out.timings["time/generate"]
    correct = sum(int(g["correct"].sum()) for _, _, g in out.drawn.parts)
    assert out.drawn.rewards.sum() == correct
    assert out.taken.plan.step == 3 and out.taken.plan.version == 2  # round 0, the step's batch


def test_without_dynamic_sampling_the_step_trains_on_its_one_round(setup):
    """One round: the pipeline's batch, scored by the task, padded to the budget; its groups are
    the group statistics of its completions, and no dynamic/* metric is reported."""
    cfg, task = setup
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, dynamic_sampling=False))
    data_iter, allocator, history, scheduler = _stages(cfg, task)
    solved = set(task.prompt_ids[::4].tolist())
    engine = ScriptedEngine(task, solved)
    planner = Planner(cfg, task, data_iter, allocator, history, scheduler)
    out = generate(_pipeline(engine), 3, planner, None)
    assert len(engine.seeds) == 1 and out.metrics == {}
    rows = next(task.iterator(cfg.data.seed, cfg.train.prompts_per_step)).indices
    np.testing.assert_array_equal(out.rollouts.rows, rows)
    completions = out.rollouts.completions
    assert [c.prompt_id for c in completions] == [
        int(task.prompt_ids[r]) for r in rows for _ in range(8)
    ]
    want, shares = task.score(completions)  # the task's own scorer, the oracle
    n = len(completions)
    assert n == cfg.budget == 128 and out.rewards.dtype == np.float32
    np.testing.assert_array_equal(out.rewards[:n], want)
    assert out.drawn.verdict_shares == shares
    [(part_rows, epoch_end, groups)] = out.drawn.parts
    np.testing.assert_array_equal(part_rows, rows)
    assert epoch_end == out.rollouts.epoch_end
    ids = np.asarray([c.prompt_id for c in completions])
    oracle = assemble.group_stats(ids, want, np.ones(n, bool))
    for key in ("prompt_id", "count", "correct", "reward_sum", "zero_variance"):
        np.testing.assert_array_equal(groups[key], oracle[key], err_msg=key)
    assert int(groups["zero_variance"].sum()) == len(set(ids.tolist()) & solved)


def test_a_further_round_of_another_weight_version_is_refused(setup):
    """Dynamic sampling's further rounds come checked from the pipeline, as its batches do."""
    cfg, task = setup
    data_iter, allocator, history, scheduler = _stages(cfg, task)
    engine = ScriptedEngine(task, solved=set())
    pipeline = _pipeline(engine)
    planner = Planner(cfg, task, data_iter, allocator, history, scheduler)
    plan = planner.request(3, 2, round_=1)
    assert pipeline.generate_now(3, plan).plan is plan
    engine.weight_version = 1  # completions tagged with another version than the plan's
    with pytest.raises(StaleBatchError, match=r"weight version\(s\) \[1\].*held version 2"):
        pipeline.generate_now(3, planner.request(3, 2, round_=2))
