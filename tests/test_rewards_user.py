"""A user's own reward function (`reward.function = "file.py:name"`, verl's signature), run in
the worker pool with the built-in scorer's limits and error handling."""

import dataclasses
import logging
import textwrap

import pytest

from dynamo_jax import config as run_config
from dynamo_jax.errors import ConfigError
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.scorer import RewardPool
from dynamo_jax.rewards.user import load_function, score_user

USER_CODE = textwrap.dedent(
    """
    import math
    import os
    import time

    calls = 0


    def exact(data_source, solution_str, ground_truth, extra_info=None):
        # Partial credit for the right source, full for the right answer: any float goes.
        if solution_str.strip() == ground_truth:
            return 1.0
        return 0.25 if data_source == "arith" else 0.0


    def as_dict(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(solution_str == ground_truth), "acc": True, "extra": extra_info}


    def as_bool(data_source, solution_str, ground_truth, extra_info=None):
        return solution_str == ground_truth


    def counts(data_source, solution_str, ground_truth, extra_info=None):
        global calls
        calls += 1
        return float(calls)


    def misbehaves(data_source, solution_str, ground_truth, extra_info=None):
        kind = solution_str
        if kind == "raise":
            raise KeyError("no such thing")
        if kind == "exit":
            raise SystemExit(3)
        if kind == "none":
            return None
        if kind == "str":
            return "1.0"
        if kind == "nan":
            return math.nan
        if kind == "no-score":
            return {"acc": 1.0}
        if kind == "spin":
            while True:
                pass
        if kind == "sleep":
            time.sleep(3600)
        if kind == "die":
            os._exit(7)
        return 0.5

    not_callable = 3
    """
)


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "my_reward.py"
    path.write_text(USER_CODE)
    return path


def _cfg(user_file, name, **kw):
    base = dict(num_workers=2, timeout_s=1.0, kill_grace_s=0.5, wall_timeout_s=3.0)
    return RewardConfig(function=f"{user_file}:{name}", **(base | kw))


def test_user_function_scores_through_the_pool(user_file):
    with RewardPool(_cfg(user_file, "exact")) as pool:
        verdicts = pool.score(
            ["12", "13", "13"], ["12", "12", "12"], sources=["arith", "arith", "other"]
        )
    assert [v.reward for v in verdicts] == [1.0, 0.25, 0.0]
    assert [v.status for v in verdicts] == ["correct", "correct", "wrong"]


@pytest.mark.parametrize("name", ["as_dict", "as_bool"])
def test_dict_and_bool_results(user_file, name):
    function = load_function(f"{user_file}:{name}")
    cfg = _cfg(user_file, name)
    assert score_user(function, "7", "7", "s", {"prompt_id": 1}, cfg).reward == 1.0
    assert score_user(function, "8", "7", "s", None, cfg).reward == 0.0


MISBEHAVIOUR = [
    ("raise", "parse_error", "raised KeyError: 'no such thing'"),
    ("exit", "parse_error", "raised SystemExit: 3"),
    ("none", "parse_error", "returned NoneType None, not a score"),
    ("str", "parse_error", "returned str '1.0', not a score"),
    ("nan", "parse_error", "returned float nan, not a score"),
    ("no-score", "parse_error", "returned dict {'acc': 1.0}, not a score"),
    ("spin", "timeout", "CPU"),
    ("sleep", "timeout", "wall-clock"),
    ("die", "parse_error", "reward worker died (exit code 7)"),
    ("fine", "correct", ""),
]


def test_a_misbehaving_user_function_never_stops_the_run(user_file, caplog):
    texts = [m[0] for m in MISBEHAVIOUR]
    # A wall cap well above the CPU limit: two workers share a loaded machine's cores.
    with RewardPool(_cfg(user_file, "misbehaves", wall_timeout_s=10.0)) as pool:
        with caplog.at_level(logging.WARNING, logger="dynamo_jax.rewards.scorer"):
            verdicts = pool.score(texts, ["x"] * len(texts))
        for (kind, status, words), verdict in zip(MISBEHAVIOUR, verdicts):
            assert verdict.status == status and words in verdict.detail, (kind, verdict)
            assert verdict.reward == (0.5 if kind == "fine" else 0.0), (kind, verdict)
        # The pool survived (hung and dead workers were replaced) and scores the next batch.
        assert [v.reward for v in pool.score(["fine", "fine"], ["x", "x"])] == [0.5, 0.5]
        assert len(pool.worker_pids()) == 2
    assert "reward.function" in caplog.text and "9 of 10 completions got no score" in caplog.text


def test_user_state_does_not_leak_into_the_trainer(user_file):
    # The function runs in the workers: its module-level counter is theirs, not this process's.
    with RewardPool(_cfg(user_file, "counts", num_workers=1)) as pool:
        assert [v.reward for v in pool.score(["a", "b"], ["x", "x"])] == [1.0, 2.0]
    assert load_function(f"{user_file}:counts")("s", "a", "x") == 1.0  # a fresh module here


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nope.py:f", "nope.py: no such file"),
        ("{file}:missing", "defines no 'missing'"),
        ("{file}", "must be 'path/to/file.py:function_name'"),
        ("{file}:not a name", "must be 'path/to/file.py:function_name'"),
        ("{dir}:f", "is not a file"),
        ("{bad}:f", "cannot be read as Python (SyntaxError"),
    ],
)
def test_bad_spec_is_one_line_at_startup(user_file, tmp_path, spec, words):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    spec = spec.format(file=user_file, dir=tmp_path, bad=bad)
    with pytest.raises(ConfigError) as info:
        run_config.build_section("reward", {"function": spec})
    message = str(info.value)
    assert message.startswith("config.reward (RewardConfig): RewardConfig.function")
    assert words in message and "\n" not in message, message


@pytest.mark.parametrize(
    "code, words",
    [
        ("import no_such_module_here\ndef f(*a):\n    return 1.0\n", "raised ModuleNotFoundError"),
        ("f = 3\n", "'f' is not callable"),
        ("from os import *\n", "'f' is not defined"),
    ],
)
def test_function_that_cannot_load_fails_the_pool_start_in_one_line(tmp_path, code, words):
    path = tmp_path / "user.py"
    path.write_text(code)
    cfg = RewardConfig(function=f"{path}:f", num_workers=2, timeout_s=1.0, wall_timeout_s=5.0)
    pool = RewardPool(cfg)
    with pytest.raises(ConfigError) as info:
        pool.start()
    assert str(info.value).startswith("reward.function: ") and words in str(info.value)
    assert "\n" not in str(info.value)
    assert pool.worker_pids() == []  # closed, nothing left running


def test_relative_path_is_resolved_where_the_run_starts(user_file, monkeypatch):
    monkeypatch.chdir(user_file.parent)
    pool = RewardPool(RewardConfig(function="my_reward.py:exact", num_workers=1))
    assert pool.cfg.function == f"{user_file}:exact"
    assert dataclasses.replace(pool.cfg).function == pool.cfg.function


def test_synthetic_task_uses_the_pool_when_a_function_is_set(user_file):
    from dynamo_jax import tasks
    from dynamo_jax.config import build_section

    cfg = type("Cfg", (), {})()
    cfg.data = build_section("data", {"task": "synthetic"})
    cfg.reward = _cfg(user_file, "exact", num_workers=1)
    scorer = tasks.make_scorer(cfg)
    try:
        assert isinstance(scorer, RewardPool)
        assert scorer.score(["3"], ["3"], sources=["synthetic"])[0].reward == 1.0
    finally:
        scorer.close()
