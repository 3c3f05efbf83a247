"""math-verify scoring: the hand-written answer-style table, hostile input, and the worker pool."""

import collections
import dataclasses
import os
import signal
import threading
import time
import types

import pytest

from dynamo_jax.rewards import scorer
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.scorer import RewardPool, score_one

# Hand-written (id, completion, gold, expected status) cases in the answer styles of the math
# data: leading zeros, fractions, radicals, intervals, \\text{} units, several boxes, no box.
C, W, N, P = "correct", "wrong", "no_answer", "parse_error"

CASES: list[tuple[str, str, str, str]] = [
    # (id, completion, gold, expected status)
    # integers, leading zeros (AIME style)
    ("lead0-strip", "So the answer is \\boxed{25}.", "025", C),
    ("lead0-same", "Thus $\\boxed{025}$", "025", C),
    ("lead0-gold-plain", "\\boxed{73}", "073", C),
    ("lead0-wrong-digits", "\\boxed{250}", "025", W),
    ("int-plain", "The total is \\boxed{843}.", "843", C),
    ("int-zero", "\\boxed{0}", "0", C),
    ("int-negative", "\\boxed{-5}", "-5", C),
    ("int-sign-wrong", "\\boxed{5}", "-5", W),
    ("int-off-by-one", "\\boxed{1023}", "1024", W),
    ("int-power", "\\boxed{2^{10}}", "1024", C),
    ("int-bold", "\\boxed{\\mathbf{2340}}", "\\mathbf{2340}", C),
    ("int-decimal-gold", "\\boxed{10}", "10.0", C),
    ("decimal-trailing-zero", "\\boxed{39.6}", "39.60", C),
    ("base-subscript", "\\boxed{66_8}", "66_8", C),
    # fractions
    ("frac-same", "\\boxed{\\frac{3}{5}}", "\\frac{3}{5}", C),
    ("frac-dfrac", "\\boxed{\\dfrac{3}{5}}", "\\frac{3}{5}", C),
    ("frac-decimal", "\\boxed{0.6}", "\\frac{3}{5}", C),
    ("frac-slash", "\\boxed{3/5}", "\\frac{3}{5}", C),
    ("frac-unreduced", "\\boxed{\\frac{6}{10}}", "\\frac{3}{5}", C),
    ("frac-inverted", "\\boxed{\\frac{5}{3}}", "\\frac{3}{5}", W),
    ("frac-gold-dollars", "\\boxed{\\frac{1}{3}}", "$\\frac{1}{3}$", C),
    ("frac-neg-numerator", "\\boxed{\\frac{-1}{2}}", "-\\frac{1}{2}", C),
    ("frac-short", "\\boxed{\\frac14}", "\\frac{1}{4}", C),
    ("frac-gold-slash", "\\boxed{\\frac{1}{27}}", "1/27", C),
    ("frac-symbolic", "\\boxed{\\frac{2(n+1)}{3}}", "\\frac{2n+2}{3}", C),
    # radicals
    ("rad-reordered", "\\boxed{-1+\\sqrt{3}}", "\\sqrt{3} - 1", C),
    ("rad-simplified", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}", C),
    ("rad-rationalised", "\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", C),
    ("rad-sign-wrong", "\\boxed{\\sqrt{3}+1}", "\\sqrt{3} - 1", W),
    ("rad-split-fraction", "\\boxed{1+\\frac{\\sqrt{6}}{2}}", "\\frac{2+\\sqrt{6}}{2}", C),
    ("rad-pi", "\\boxed{3\\sqrt{3}-\\pi}", "3\\sqrt{3}-\\pi", C),
    ("pi-multiple", "\\boxed{18\\pi}", "18\\pi", C),
    ("pi-vs-decimal", "\\boxed{\\pi}", "3.14", W),
    # intervals, sets, tuples
    ("interval-same", "\\boxed{(5, \\infty)}", "(5,\\infty)", C),
    ("interval-closed-wrong", "\\boxed{[5,\\infty)}", "(5,\\infty)", W),
    (
        "interval-union",
        "\\boxed{(-\\infty, 2] \\cup [3, \\infty)}",
        "(-\\infty,2]\\cup[3,\\infty)",
        C,
    ),
    (
        "tuple-left-right",
        "\\boxed{\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)}",
        "\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)",
        C,
    ),
    (
        "tuple-wrong-entry",
        "\\boxed{(-\\frac{5}{11}, \\frac{11}{12})}",
        "\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)",
        W,
    ),
    ("list-same", "\\boxed{1, 3}", "1,3", C),
    ("list-reordered", "\\boxed{3, 1}", "1,3", C),
    ("list-gold-dollars", "\\boxed{8, 4}", "$8$,$4$", C),
    ("list-wrong", "\\boxed{1, 2}", "1,3", W),
    ("empty-set", "\\boxed{\\varnothing}", "\\varnothing", C),
    # units and \text{}
    ("deg-same", "\\boxed{540^\\circ}", "540^\\circ", C),
    ("deg-dropped", "\\boxed{540}", "540^\\circ", C),
    ("percent", "\\boxed{10\\%}", "10\\%", C),
    ("text-unit", "\\boxed{5 \\text{ cm}}", "5", C),
    ("text-unit-words", "\\boxed{18 \\text{ square units}}", "18", C),
    ("text-word", "\\boxed{\\text{Thursday}}", "\\text{Thursday}", C),
    ("text-word-plain-gold", "\\boxed{\\text{Thursday}}", "Thursday", C),
    ("text-word-wrong", "\\boxed{\\text{Friday}}", "\\text{Thursday}", W),
    ("text-choice", "\\boxed{\\text{(C)}}", "\\text{(C)}", C),
    # expressions and equations
    ("expr-product", "\\boxed{3n}", "$3 n$", C),
    ("poly-reordered", "\\boxed{1+16x+24x^2+4x^3-x^5}", "-x^5+4x^3+24x^2+16x+1", C),
    ("poly-wrong", "\\boxed{1+16x+24x^2+4x^3+x^5}", "-x^5+4x^3+24x^2+16x+1", W),
    ("equation-gold", "\\boxed{-1}", "y = -1", C),
    ("function-def", "\\boxed{f(x) = x + 1}", "f(x) = x + 1", C),
    ("factorial", "\\boxed{15 \\cdot 2013!}", "15(2013!)", C),
    # several boxes: they must agree (docs/rewards.md: a completion that commits to more than
    # one final answer earns 0, however it revises itself); an unclosed last box is left out
    ("multi-revised", "First \\boxed{3}. Wait, that is wrong: \\boxed{4}", "4", W),
    ("multi-same-value", "So \\boxed{\\frac{1}{2}}, i.e. \\boxed{0.5}", "0.5", C),
    ("multi-first-not-used", "First \\boxed{3}. Wait, that is wrong: \\boxed{4}", "3", W),
    ("multi-truncated-last", "So \\boxed{4}. Hmm, maybe \\boxed{3", "4", C),
    (
        "multi-nested-braces",
        "\\boxed{\\frac{1}{2}} then \\boxed{\\frac{\\sqrt{3}}{2}}",
        "\\frac{\\sqrt{3}}{2}",
        W,
    ),
    ("fbox", "The answer: \\fbox{7}", "7", C),
    ("boxed-no-braces", "so $\\boxed 7$", "7", C),
    ("non-latin-text", "答案是 \\boxed{12}", "12", C),
    # no box: math-verify's own extraction, or nothing at all
    ("nobox-answer-is", "The answer is 42.", "42", C),
    ("nobox-final-latex", "The final answer is $\\frac{1}{2}$.", "\\frac12", C),
    ("nobox-wrong", "The answer is 41.", "42", W),
    ("nobox-nothing", "I cannot solve this problem.", "42", N),
    ("empty-completion", "", "42", N),
    ("empty-box", "\\boxed{}", "3", N),
    # bad gold (6 training rows have an empty ground truth)
    ("empty-gold", "\\boxed{1}", "", P),
]


# Short limits keep the pool tests fast; the hostile cases below still exceed them, while the
# slowest honest case (~0.45 CPU s, cold) keeps a 2x margin. Limits are CPU time, so a loaded
# machine slows the tests down but does not change verdicts.
FAST = RewardConfig(num_workers=3, timeout_s=1.0, kill_grace_s=0.5, wall_timeout_s=20.0)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(FAST) as p:
        yield p


def test_table_has_enough_hand_written_cases():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)
    assert {c[3] for c in CASES} == {"correct", "wrong", "no_answer", "parse_error"}


@pytest.mark.parametrize("case_id, completion, gold, expected", CASES, ids=[c[0] for c in CASES])
def test_hand_written_case_in_process(case_id, completion, gold, expected):
    verdict = score_one(completion, gold, FAST)
    assert verdict.status == expected, verdict
    assert verdict.reward == (1.0 if expected == "correct" else 0.0)


def test_pool_agrees_with_in_process_and_keeps_order(pool):
    completions = [c[1] for c in CASES]
    golds = [c[2] for c in CASES]
    verdicts = pool.score(completions, golds)
    assert [v.status for v in verdicts] == [c[3] for c in CASES]


def test_reward_values_are_configurable():
    cfg = RewardConfig(correct_reward=2.0, wrong_reward=-1.0, no_answer_reward=-0.5)
    assert score_one("\\boxed{4}", "4", cfg).reward == 2.0
    assert score_one("\\boxed{5}", "4", cfg).reward == -1.0
    assert score_one("no answer", "4", cfg).reward == -0.5
    assert score_one("x" * (cfg.max_chars + 1), "4", cfg).reward == -1.0


def _hostile_completions(marker: str) -> dict[str, str]:
    """Injection attempts that would create `marker` if anything evaluated them."""
    touch = f"__import__('os').system('touch {marker}')"
    write = f"open('{marker}', 'w').write('x')"
    return {
        "boxed-import": "\\boxed{" + touch + "}",
        "boxed-eval": '\\boxed{eval("' + write + '")}',
        "boxed-exec": '\\boxed{exec("' + write + '")}',
        "boxed-lambda": "\\boxed{(lambda: " + touch + ")()}",
        "boxed-text-import": "\\boxed{\\text{" + touch + "}}",
        "boxed-sympy": "\\boxed{Symbol('x').__class__.__init__.__globals__['os'].system('touch "
        + marker
        + "')}",
        "answer-is-eval": 'The answer is eval("' + write + '").',
        "answer-is-import": "Final answer: " + touch,
        "dollar-import": "$" + touch + "$",
        "expr-lambda": "answer = (lambda: " + write + ")()",
    }


def _pathological_completions() -> dict[str, str]:
    deep = 10_000
    return {
        "1MB-garbage": "7" * 1_000_000,
        "1MB-with-correct-box": "x" * 1_000_000 + "\\boxed{42}",
        "nesting-braces-boxed": "\\boxed{" + "{" * deep + "1" + "}" * deep + "}",
        "nesting-parens-text": "$" + "(" * deep + "42" + ")" * deep + "$",
        "nesting-frac": "\\boxed{" + "\\frac{1}{" * 2_000 + "2" + "}" * 2_000 + "}",
        "tower-latex": "\\boxed{9^{9^{9^{9}}}}",
        "tower-expr": "The answer is 9**9**9**9.",
        "huge-power": "\\boxed{10^{10^{10}}}",
        "huge-factorial": "\\boxed{(10^{10})!}",
    }


def test_hostile_text_scores_zero_executes_nothing_in_process(tmp_path):
    marker = tmp_path / "pwned"
    for name, text in _hostile_completions(str(marker)).items():
        verdict = score_one(text, "42", FAST)
        assert verdict.reward == 0.0, (name, verdict)
        assert not marker.exists(), f"{name} executed code"


def test_hostile_and_pathological_text_in_pool(pool, tmp_path):
    marker = tmp_path / "pwned"
    cases = {**_hostile_completions(str(marker)), **_pathological_completions()}
    start = time.perf_counter()
    verdicts = pool.score(list(cases.values()), ["42"] * len(cases))
    elapsed = time.perf_counter() - start
    for name, verdict in zip(cases, verdicts):
        assert verdict.reward == 0.0, (name, verdict)
        assert verdict.status in ("wrong", "no_answer", "parse_error", "timeout"), (name, verdict)
    assert not marker.exists()
    by_name = dict(zip(cases, verdicts))
    assert by_name["1MB-with-correct-box"].status == "parse_error"  # bounded input length
    assert by_name["tower-expr"].status == "timeout"
    # Every item is bounded by the wall cap; 3 workers share them (plus respawn slack).
    assert elapsed < len(cases) * FAST.wall_timeout_s / FAST.num_workers + 10.0, elapsed
    # The pool survived: a normal batch still scores.
    assert [v.status for v in pool.score(["\\boxed{1}", "\\boxed{2}"], ["1", "1"])] == [
        "correct",
        "wrong",
    ]


def _signal_workers_soon(pids, sig):
    def send():
        time.sleep(0.3)
        for pid in pids:
            os.kill(pid, sig)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


# Busy for the whole time limit (it ends in the worker's own timeout or work budget), so every
# worker still holds one of these when the signal lands. (A power tower no longer is: it is
# refused by its size in milliseconds, see rewards/budget.py.) 16 nested braces cost the ANTLR
# parser seconds of CPU.
SLOW = "\\boxed{" + "{" * 16 + "1" + "}" * 16 + "}"


def test_hung_workers_are_killed_at_the_wall_cap_and_replaced():
    # A stopped process is the most deterministic hang: it never answers and uses no CPU, so
    # only the parent's wall-clock cap can end the item.
    cfg = dataclasses.replace(FAST, wall_timeout_s=2.0)
    with RewardPool(cfg) as pool:
        victims = pool.worker_pids()
        sender = _signal_workers_soon(victims, signal.SIGSTOP)
        start = time.perf_counter()
        verdicts = pool.score([SLOW] * 3 + ["\\boxed{5}"] * 3, ["5"] * 6)
        elapsed = time.perf_counter() - start
        sender.join()
        assert all(v.status == "timeout" and "wall-clock" in v.detail for v in verdicts[:3]), (
            verdicts
        )
        assert [v.status for v in verdicts[3:]] == ["correct"] * 3
        assert pool.restarts == 3
        assert not set(victims) & set(pool.worker_pids())
        assert elapsed < 2 * cfg.wall_timeout_s + 5.0


def test_worker_stuck_in_c_code_is_killed_by_cpu_time(pool):
    # 9**9**9**9 spends seconds inside one big-integer power, where no signal is handled; the
    # parent kills it after timeout_s + kill_grace_s CPU seconds (or the worker's own deadline
    # catches it between C calls on a fast machine). Either way: a timeout, and the pool goes on.
    restarts = pool.restarts
    verdicts = pool.score(["The answer is 9**9**9**9.", "\\boxed{3}"], ["1", "3"])
    assert verdicts[0].status == "timeout" and verdicts[1].status == "correct"
    killed = "killed" in verdicts[0].detail
    assert pool.restarts == restarts + killed
    assert len(pool.worker_pids()) == FAST.num_workers


def test_dead_workers_are_replaced_and_batch_completes(pool):
    victims = pool.worker_pids()
    sender = _signal_workers_soon(victims, signal.SIGKILL)
    verdicts = pool.score([SLOW] * 3 + ["\\boxed{5}"] * 3, ["5"] * 6)
    sender.join()
    assert all(v.status == "parse_error" and "died" in v.detail for v in verdicts[:3]), verdicts
    assert [v.status for v in verdicts[3:]] == ["correct"] * 3
    assert not set(victims) & set(pool.worker_pids())
    assert [v.status for v in pool.score(["\\boxed{5}"] * 3, ["5"] * 3)] == ["correct"] * 3


def test_a_worker_sigkilled_mid_item_is_noticed_at_once_and_replaced():
    """What the OOM killer does to a worker (a real SIGKILL while it scores): the pipe closes,
    the item gets its verdict at once (not at a time limit) and a fresh worker takes over."""
    cfg = dataclasses.replace(FAST, num_workers=1, timeout_s=30.0, wall_timeout_s=60.0)
    with RewardPool(cfg) as pool:
        [victim] = pool.worker_pids()
        killed_at = []

        def kill():
            time.sleep(0.5)
            killed_at.append(time.perf_counter())
            os.kill(victim, signal.SIGKILL)

        thread = threading.Thread(target=kill)
        thread.start()
        verdicts = pool.score([SLOW, "\\boxed{5}"], ["5", "5"])
        noticed = time.perf_counter() - killed_at[0]
        thread.join()
        assert verdicts[0].status == "parse_error", verdicts
        assert (
            verdicts[0].detail
            == "reward worker died (exit code -9) (SIGKILL: the OOM killer or kill -9)"
        )
        assert verdicts[1].status == "correct"
        assert pool.restarts == 1 and pool.worker_pids() != [victim]
        assert noticed < 10.0  # the replacement's start-up and the second item, not a limit
        print(f"worker SIGKILL noticed; batch done {noticed:.2f} s after the kill")


def test_score_validates_arguments(pool):
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        pool.score(["a", "b"], ["1"])
    with pytest.raises(TypeError, match="gold answer 0 must be a str"):
        pool.score(["a"], [1])
    assert pool.score([None], ["1"])[0].status == "parse_error"


def test_score_one_refuses_non_main_thread():
    errors = []
    thread = threading.Thread(
        target=lambda: errors.append(_catch(lambda: score_one("1", "1", FAST)))
    )
    thread.start()
    thread.join()
    assert isinstance(errors[0], RuntimeError)


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned for the assertion
        return exc
    return None


@pytest.mark.parametrize(
    "field, value",
    [
        ("timeout_s", 0.0),
        ("kill_grace_s", -1.0),
        ("max_chars", 0),
        ("num_workers", 0),
        ("start_method", "fork"),
        ("worker_memory_mb", -1),
        ("correct_reward", "1"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"RewardConfig.{field}"):
        RewardConfig(**{field: value})


def test_spawn_start_method_works_too():
    with RewardPool(dataclasses.replace(FAST, num_workers=1, start_method="spawn")) as pool:
        verdicts = pool.score(["\\boxed{\\frac{1}{2}}", "\\boxed{2}"], ["0.5", "3"])
    assert [v.status for v in verdicts] == ["correct", "wrong"]


def test_empty_batch(pool):
    assert pool.score([], []) == []


# ----------------------------------------------------------------------------- group affinity


@pytest.mark.parametrize(
    "golds, own, claimed, expected",
    [
        (["a", "a", "b", "b"], "b", set(), 2),  # its own group first, though not at the front
        (["a", "a", "b", "b"], None, {"a"}, 2),  # a group no other worker holds
        (["a", "b", "c"], "z", {"a", "b"}, 2),  # its own group done: the next free one
        (["a", "a", "b"], None, {"a", "b"}, 0),  # every group held: the front, no idling
        ([], None, set(), 0),
    ],
)
def test_next_position(golds, own, claimed, expected):
    assert scorer.next_position(golds, own, claimed) == expected


class _FakeWorker:
    ready = True

    def __init__(self):
        self.conn = object()


def _dispatch_golds(num_workers: int, golds: list[str], shared: bool) -> list[str]:
    """Each worker's golds, in order, when the workers take items in turn."""
    workers = [_FakeWorker() for _ in range(num_workers)]
    pool = types.SimpleNamespace(cfg=RewardConfig(), _workers=workers)
    items = [(f"text {i}", gold, None, None, shared) for i, gold in enumerate(golds)]
    batch = scorer._Batch(pool, collections.deque(range(len(golds))), items, [None] * len(golds))
    served = {id(w): "" for w in workers}
    while batch.pending:
        for worker in workers:
            if batch.pending:
                served[id(worker)] += items[batch._take(worker)][1]
    return sorted(served.values())


def test_a_pools_workers_each_keep_to_a_group():
    """Four workers, four groups of 8 sharing a gold: each worker scores one whole group (so
    each gold is read once), where taking the queue's front gave every worker every gold."""
    golds = [gold for gold in "abcd" for _ in range(8)]
    assert _dispatch_golds(4, golds, shared=True) == [
        "aaaaaaaa",
        "bbbbbbbb",
        "cccccccc",
        "dddddddd",
    ]
    # more groups than workers: a worker done with its group takes the next free one
    golds = [gold for gold in "abcdef" for _ in range(4)]
    assert _dispatch_golds(2, golds, shared=True) == ["aaaacccceeee", "bbbbddddffff"]
    # lone items (no neighbour shares the gold) hold no group: the queue's order
    assert _dispatch_golds(2, list("abcd"), shared=False) == ["ac", "bd"]
