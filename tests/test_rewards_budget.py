"""Time-outs decided by work done: the full verdict (reward and status) is a function of the
input alone, whatever the machine's load and whatever was scored before."""

import contextlib
import cProfile
import dataclasses
import os
import pstats
import re
import subprocess
import sys
import textwrap

import pytest
from antlr4.atn.ParserATNSimulator import ParserATNSimulator

from dynamo_jax.rewards import budget
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.isolate import call_isolated, score_isolated, score_item
from dynamo_jax.rewards.math_check import _reset_state, _score_unbounded, score_one, time_limit
from dynamo_jax.rewards.scorer import RewardPool
from dynamo_jax.rewards.worker import warm_up

# A generous CPU net, so that only the work budget can decide these items' status.
CFG = RewardConfig(
    num_workers=2, max_work_calls=300_000, timeout_s=60.0, kill_grace_s=1.0, wall_timeout_s=120.0
)
# Nested braces cost math-verify's parser exponentially in the depth (16 levels: ~20 CPU s, so
# a CPU-time limit decided their status by the machine's speed and load).
NESTED = {d: "\\boxed{" + "{" * d + "42" + "}" * d + "}" for d in (2, 12, 16)}
TOWER = "\\boxed{9^{9^{9^{9}}}}"


@pytest.fixture(scope="module", autouse=True)
def _warm_like_a_worker():
    # Start this process from the workers' warm state, so that in-process results below do not
    # depend on which tests ran before (the parser's cache only grows).
    warm_up()


def _count(text: str, gold: str, cfg: RewardConfig) -> int:
    _reset_state()
    return budget.calls_made(_score_unbounded, text, gold, cfg)


def _calls(text: str, gold: str, cfg: RewardConfig = CFG) -> int:
    # In a fresh fork of this (warm) process, as the pool's workers score.
    return call_isolated(_count, text, gold, cfg)


def test_call_counts_are_a_function_of_the_input():
    texts = ("\\boxed{\\frac{3}{5}}", "\\boxed{(5, \\infty)}", NESTED[2], "\\boxed{1, 3}")
    first = [_calls(t, "0.6") for t in texts]
    for text in texts[::-1]:  # other items scored in between, as a worker does: in forks
        score_isolated(text, "0.6", CFG)
    assert [_calls(t, "0.6") for t in texts] == first


_HISTORY = """
import sys
sys.path.insert(0, sys.argv[1])
import test_rewards_budget as t
text = "\\\\boxed{\\\\left( \\\\frac{7}{13}, \\\\sqrt{17} \\\\right]}"
t.warm_up()
fresh = t._calls(text, "1")
t.score_one(text, "1", t.CFG)
print(fresh, t._count(text, "1", t.CFG))
"""


def test_in_process_counts_depend_on_history_which_is_why_workers_fork():
    # What isolate.py is for: ANTLR's prediction cache grows with every input it parses. Shown
    # in a fresh interpreter from the workers' warm state: in this process, what other test
    # files scored before (and Python's bounded `re` pattern cache, which evicts) can move the
    # count either way, which is the point, but not a fixed direction to assert.
    out = subprocess.run(
        [sys.executable, "-c", _HISTORY, os.path.dirname(__file__)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    fresh, after = map(int, out.stdout.split()[-2:])
    assert after < fresh, (fresh, after)


def test_counts_do_not_depend_on_when_the_budget_is_checked(monkeypatch):
    # The count is read by a handler on a CPU clock (budget._check): every ~0.2 ms here, or
    # never during the item. Its own frames must not be counted, or the count (and the status at
    # the budget's edge) would depend on the clock.
    text = "\\boxed{\\left( \\frac{7}{13}, \\sqrt{17} \\right]}"
    counts = {}
    for every in (100.0, 0.001, 0.0002):
        monkeypatch.setattr(budget, "_CHECK_EVERY_S", every)
        counts[every] = _calls(text, "1")
    assert len(set(counts.values())) == 1, counts


# math-verify's LaTeX parse runs with the profiler off (Python 3.11 runs every instruction
# unspecialised while a profile hook is set); its ANTLR closure steps are counted instead.
_STEPS = {
    ("ParserATNSimulator.py", "closureCheckingStopState"),
    ("LexerATNSimulator.py", "closure"),
}


def _steps_counted(text: str, gold: str) -> int:
    _count(text, gold, CFG)
    return budget._Budget.steps


def _steps_profiled(text: str, gold: str) -> int:
    _reset_state()
    profile = cProfile.Profile()
    profile.runcall(_score_unbounded, text, gold, CFG)
    stats = pstats.Stats(profile).stats
    return sum(stats[key][1] for key in stats if (os.path.basename(key[0]), key[2]) in _STEPS)


def test_the_latex_parse_counts_its_closure_steps():
    # The oracle is CPython's own profiler: every call of the two recursive closure methods
    # (none where the warm prediction cache already holds the lookahead, as for 3/5; the
    # lexer's own for \\overline).
    items = PARSER + [(NESTED[2], "42"), ("\\boxed{\\overline{AB}}", "\\overline{AB}")]
    steps = [call_isolated(_steps_counted, text, gold) for text, gold in items]
    assert steps == [call_isolated(_steps_profiled, text, gold) for text, gold in items]
    assert sum(steps) > 0, steps


def _hooks_seen_by_the_parser(text: str, gold: str) -> list:
    seen, predict = [], ParserATNSimulator.adaptivePredict

    def spy(self, *args):
        seen.append(sys.getprofile() is None)
        return predict(self, *args)

    ParserATNSimulator.adaptivePredict = spy  # in a fork: gone with it
    _count(text, gold, CFG)
    return seen


def test_the_latex_parse_runs_without_a_profile_hook():
    seen = call_isolated(_hooks_seen_by_the_parser, "\\boxed{\\frac{3}{5}}", "0.6")
    assert seen and all(seen), seen


def test_a_runaway_is_cut_while_it_runs():
    def forever():
        while True:
            _calls_something()

    with time_limit(20.0):  # this test's own net: DeadlineExceeded if the check never cuts
        with pytest.raises(budget.WorkBudgetExceeded), budget.work_budget(100_000):
            forever()
    assert budget.exceeded()


# Items that never run math-verify's parser: isolate.score_item scores them without a fork.
NO_PARSER = [
    ("\\boxed{29}", "29"),
    ("So \\boxed{27}. Wait, recheck: \\boxed{29}.", "29"),
    ("The answer is 216.", "215"),
    ("Hmm, this needs more work on the second case, where", "3"),
    ("\\boxed{12 \\text{ maybe thirteen}}", "12"),
    ("The answer is 12 or 13.", "12"),
]
PARSER = [("\\boxed{\\frac{3}{5}}", "0.6"), ("The answer is $x = 2$.", "2")]


def _no_fork(*args):
    raise AssertionError("forked")


def test_items_scored_without_a_fork_count_what_a_fork_counts(monkeypatch):
    # The same edge as in a fork (test_the_budget_edge_is_exact), here in this process.
    for text, gold in NO_PARSER:
        needed = _calls(text, gold)
        with monkeypatch.context() as patch:
            patch.setattr(os, "fork", _no_fork)
            at = score_item(text, gold, dataclasses.replace(CFG, max_work_calls=needed))
            below = score_item(text, gold, dataclasses.replace(CFG, max_work_calls=needed - 1))
        assert at.status != "timeout" and below.status == "timeout", (text, needed)
        assert at == score_isolated(text, gold, CFG)


def test_scoring_without_a_fork_leaves_the_state_forks_start_from():
    re.purge()  # so that the items below compile their patterns in this process
    before = [_calls(text, gold) for text, gold in PARSER], dict(re._cache)
    verdicts = [score_item(text, gold, CFG) for text, gold in NO_PARSER + PARSER]
    assert verdicts == [score_isolated(text, gold, CFG) for text, gold in NO_PARSER + PARSER]
    assert ([_calls(text, gold) for text, gold in PARSER], dict(re._cache)) == before


def test_the_budget_edge_is_exact():
    # The status flips at exactly the number of calls the item makes: no clock involved.
    text = "\\boxed{\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)}"
    needed = _calls(text, "(1, 2)")
    at = score_isolated(text, "(1, 2)", dataclasses.replace(CFG, max_work_calls=needed))
    below = score_isolated(text, "(1, 2)", dataclasses.replace(CFG, max_work_calls=needed - 1))
    assert at.status == "wrong" and below.status == "timeout"
    assert "work budget" in below.detail


def test_deep_nesting_gets_the_same_verdict_every_time_and_after_other_items():
    first = [score_one(NESTED[d], "42", CFG) for d in (12, 16)]
    assert all(v.status == "timeout" and "work budget" in v.detail for v in first), first
    for _ in range(2):
        score_one("\\boxed{\\frac{1}{2}}", "0.5", CFG)  # other work in between
        assert [score_one(NESTED[d], "42", CFG) for d in (12, 16)] == first
    assert score_one(NESTED[2], "42", CFG).status == "correct"


def test_power_towers_are_refused_by_size_not_by_a_kill():
    verdict = score_one(TOWER, "1", CFG)
    assert verdict.status == "timeout" and "work budget" in verdict.detail
    assert score_one("\\boxed{2^{20}}", "1048576", CFG).status == "correct"  # small powers fine
    # The same tower as plain text reaches math-verify's numeric check as a Float power, which
    # was computed until the 60 CPU s net killed it; it is refused by its size now.
    for text in (
        "The answer is 9**9**9**9.",
        "The answer is 9.0**9**9**9.",
        "\\boxed{0.5^{9^{9^9}}}",
    ):
        verdict = score_one(text, "1", CFG)
        assert verdict.status == "timeout" and "work budget" in verdict.detail, text
    assert score_one("\\boxed{0.5^{10}}", "0.0009765625", CFG).status == "correct"
    # A float base near 1 grows slowly: a large exponent is cheap and stays allowed.
    assert score_one("\\boxed{1.0000001^{10000000}}", "2.718281692", CFG).status == "correct"
    assert score_one("The answer is 2**0.5", "1.41421356237", CFG).status == "correct"


def test_a_swallowed_budget_exception_still_times_out():
    def swallows():
        try:
            while True:
                _calls_something()
        except BaseException:  # noqa: BLE001 - what a careless library might do
            pass
        return "done"

    with budget.work_budget(1000):
        assert swallows() == "done"
    assert budget.exceeded()


def _calls_something():
    return None


_BURN = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


@contextlib.contextmanager
def _loaded_machine():
    """Busy-loop processes on every core while the block runs."""
    burners = [
        subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(max(2, os.cpu_count() or 2))
    ]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


HEAVY = [NESTED[12], NESTED[16], TOWER, NESTED[2], "\\boxed{(5, \\infty)}"]
HEAVY_GOLDS = ["42", "42", "1", "42", "(5,\\infty)"]


def test_pool_verdicts_do_not_depend_on_what_was_scored_before():
    with RewardPool(CFG) as pool:
        first = pool.score(HEAVY, HEAVY_GOLDS)
        pool.score(HEAVY[::-1] + ["\\boxed{\\frac{1}{2}}"], HEAVY_GOLDS[::-1] + ["0.5"])
        assert pool.score(HEAVY, HEAVY_GOLDS) == first
    assert [v.status for v in first] == ["timeout", "timeout", "timeout", "correct", "correct"]
    assert all("work budget" in v.detail for v in first[:3])
    with RewardPool(CFG) as fresh:  # new workers, same verdicts
        assert fresh.score(HEAVY[::-1], HEAVY_GOLDS[::-1]) == first[::-1]


def test_pool_verdicts_are_the_same_in_any_order_and_any_grouping():
    # Integer items (no parser), parsed ones, and one past its budget, in batches of any size.
    items = [
        ("\\boxed{29}", "29"),
        ("So \\boxed{27}. Wait, recheck: \\boxed{29}.", "29"),
        ("The answer is 216.", "215"),
        ("\\boxed{\\frac{3}{5}}", "0.6"),
        ("\\boxed{(5, \\infty)}", "(5,\\infty)"),
        (NESTED[12], "42"),
        ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}"),
    ]
    order = [4, 0, 6, 2, 5, 1, 3]
    with RewardPool(dataclasses.replace(CFG, num_workers=1)) as pool:
        first = pool.score([t for t, _ in items], [g for _, g in items])
        shuffled = pool.score([items[i][0] for i in order], [items[i][1] for i in order])
        grouped = [
            v
            for i in range(0, len(items), 3)
            for v in pool.score([t for t, _ in items[i : i + 3]], [g for _, g in items[i : i + 3]])
        ]
    # The revision is wrong: both boxes were committed to (docs/rewards.md).
    statuses = ["correct", "wrong", "wrong", "correct", "correct", "timeout", "correct"]
    assert [v.status for v in first] == statuses
    assert [first[i] for i in order] == shuffled
    assert grouped == first


def test_a_group_sharing_a_gold_gets_the_verdicts_its_items_get_alone():
    # Neighbours sharing a gold are scored from the worker's server for it (isolate.GoldServer);
    # one item per batch is scored in its own fork.
    items = [
        ("\\boxed{\\frac{3}{5}}", "0.6"),
        ("\\boxed{0.60}", "0.6"),
        ("So $\\boxed{\\sqrt{0.36}}$.", "0.6"),
        ("\\boxed{(5, \\infty)}", "(5,\\infty)"),
        ("\\boxed{[5, \\infty)}", "(5,\\infty)"),
        (NESTED[12], "42"),
        (NESTED[2], "42"),
    ]
    with RewardPool(CFG) as pool:
        together = pool.score([t for t, _ in items], [g for _, g in items])
        alone = [pool.score([t], [g])[0] for t, g in items]
    assert together == alone
    assert [v.status for v in together] == [
        "correct",
        "correct",
        "correct",
        "correct",
        "wrong",
        "timeout",
        "correct",
    ]


def test_same_verdicts_in_the_pool_under_load():
    # The reference comes from a pool too: a worker scores from its own warm state, which this
    # test process (whatever it parsed before) does not share.
    with RewardPool(CFG) as pool:
        expected = pool.score(HEAVY, HEAVY_GOLDS)
        with _loaded_machine():
            assert pool.score(HEAVY, HEAVY_GOLDS) == expected
            with RewardPool(CFG) as fresh:
                assert fresh.score(HEAVY, HEAVY_GOLDS) == expected
        assert pool.restarts == 0  # nothing had to be killed


def test_pool_workers_run_with_a_fixed_hash_seed(tmp_path):
    user = tmp_path / "seed.py"
    user.write_text(
        textwrap.dedent(
            """
            def seed(data_source, solution_str, ground_truth, extra_info=None):
                return float(hash("dynamo") % 1000 + 1)
            """
        )
    )
    cfg = RewardConfig(function=f"{user}:seed", num_workers=1)
    with RewardPool(cfg) as pool:
        got = pool.score(["x"], ["y"])[0].reward
    env = dict(os.environ, PYTHONHASHSEED="0")
    want = subprocess.run(
        [sys.executable, "-c", "print(hash('dynamo') % 1000 + 1)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if os.environ.get("PYTHONHASHSEED") not in (None, "0"):
        pytest.skip("the user fixed another hash seed for this process")
    assert got == float(want)


def test_a_zero_budget_switches_counting_off():
    cfg = dataclasses.replace(CFG, max_work_calls=0, timeout_s=1.0, wall_timeout_s=20.0)
    assert score_one("\\boxed{\\frac{1}{2}}", "0.5", cfg).status == "correct"
    assert "CPU" in score_one(NESTED[16], "42", cfg).detail  # the CPU limit decides, not work
    with pytest.raises(ValueError, match="RewardConfig.max_work_calls"):
        RewardConfig(max_work_calls=-1)


def test_a_swallowed_cpu_deadline_still_times_the_item_out(monkeypatch):
    """A library's bare `except:` catching the deadline and going on to a verdict: the item is
    still a `timeout` (as the work budget's flag does for a swallowed budget)."""
    import time

    from dynamo_jax.rewards import math_check

    def swallowing(text, gold, cfg, prepared=None):
        end = time.process_time() + 0.5
        while time.process_time() < end:
            try:
                sum(range(10_000))
            except BaseException:  # noqa: BLE001, S110  (what the test stands for)
                pass
        return math_check.make_verdict("correct", cfg)

    monkeypatch.setattr(math_check, "_score_unbounded", swallowing)
    cfg = dataclasses.replace(CFG, max_work_calls=0, timeout_s=0.1, wall_timeout_s=20.0)
    verdict = score_one("\\boxed{42}", "42", cfg)
    assert (verdict.status, verdict.detail) == ("timeout", "exceeded 0.1 CPU s")


def _evaluate(times: int) -> None:
    for _ in range(times):
        eval("1 + 1")  # noqa: S307 - a new, equal code object each time, as SymPy's parse_expr


def test_equal_code_objects_are_each_counted():
    # The profiler keeps an entry per code object; equal ones (the same text evaluated twice)
    # once collapsed into one dict key, so a count depended on how an item's work was split.
    assert budget.calls_made(_evaluate, 3) - budget.calls_made(_evaluate, 1) == 2
