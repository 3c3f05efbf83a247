"""A prepared gold: the reading an item would make, its count and outcome kept for its items."""

import dataclasses

import pytest

from dynamo_jax.rewards import budget
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.gold import PreparedGold, prepare_gold
from dynamo_jax.rewards.isolate import call_isolated
from dynamo_jax.rewards.math_check import read_gold
from dynamo_jax.rewards.worker import warm_up

CFG = RewardConfig(max_work_calls=300_000, timeout_s=60.0)


@pytest.fixture(scope="module", autouse=True)
def _warm_like_a_worker():
    warm_up()


def _prepared(gold, cfg):
    prepared = prepare_gold(gold, cfg)
    return dataclasses.replace(prepared, read=None if prepared.read is None else prepared.read[0])


def _read_count(gold):
    budget.calls_made(read_gold, gold)
    return budget.last_made()


def test_a_prepared_gold_is_read_gold_and_its_count_less_the_frames_take_adds():
    prepared = call_isolated(_prepared, "\\frac{3}{5}", CFG)
    assert prepared.read == "\\frac{3}{5}" and prepared.error is None and not prepared.exceeded
    overhead = call_isolated(budget.calls_made, lambda: None) - 1
    # take and add_prior_work stand where read_gold's frame was: one frame more.
    assert prepared.calls == call_isolated(_read_count, "\\frac{3}{5}") - overhead - 2


def test_a_reading_that_raised_raises_again_for_every_item():
    error = ValueError("bad gold")
    prepared = PreparedGold("x", None, error, 10, False)
    for _ in range(2):
        with pytest.raises(ValueError, match="bad gold"):
            prepared.take()


def test_a_reading_past_the_budget_is_marked_spent():
    prepared = call_isolated(
        _prepared, "{" * 10 + "42" + "}" * 10, dataclasses.replace(CFG, max_work_calls=500)
    )
    assert prepared.exceeded


def test_number_mode_is_refused():
    with pytest.raises(ValueError, match="answer_format='math'"):
        prepare_gold("12", dataclasses.replace(CFG, answer_format="number"))
