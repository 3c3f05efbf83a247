"""A worker's items scored from its gold's server (isolate.GoldServer) count the calls, and get
the verdict, of their own fork of the warm worker (isolate.score_isolated)."""

import dataclasses
import os
import pickle
import signal

import pytest

from benchmarks.rewards import make_completions
from benchmarks.rewards_vs_math_verify import needs_parser
from dynamo_jax.rewards import budget, isolate
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.isolate import GoldServer, call_isolated, score_isolated, score_item
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.worker import warm_up

CFG = RewardConfig(max_work_calls=300_000, timeout_s=60.0, kill_grace_s=1.0)


@pytest.fixture(scope="module", autouse=True)
def _warm_like_a_worker():
    warm_up()
    yield
    isolate.close_gold_server()


def _verdict_and_calls(text, gold, cfg, prepared=None):
    return score_one(text, gold, cfg, prepared=prepared), budget.last_made()


def _groups():
    """Groups of completions sharing a gold, in the styles a policy writes, that reach the
    parser; and a few of this file's own."""
    texts, golds = make_completions(48, seed=5, group=6)
    groups: dict[str, list[str]] = {}
    for text, gold in zip(texts, golds):
        if needs_parser(text, gold, CFG):
            groups.setdefault(gold, []).append(text)
    groups.setdefault("0.6", []).extend(["\\boxed{\\frac{3}{5}}", "So $\\boxed{0.60}$ or so."])
    groups["(1, 2)"] = [
        "\\boxed{\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)}",
        "\\boxed{(1,2)}",
    ]
    return groups


def test_an_item_served_from_its_gold_counts_and_scores_as_in_its_own_fork():
    groups, items = _groups(), 0
    assert len(groups) >= 5
    for gold, texts in groups.items():
        server = GoldServer(gold, CFG)
        try:
            for text in texts:  # one server for the whole group: serving leaves it unchanged
                data, status = server.call(_verdict_and_calls, text, gold, CFG)
                assert status == 0
                served = pickle.loads(data)
                assert served == call_isolated(_verdict_and_calls, text, gold, CFG), (gold, text)
                items += 1
        finally:
            server.close()
    assert items >= 12


def test_the_budget_edge_is_the_same_call_when_served():
    text, gold = "\\boxed{\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)}", "(1, 2)"
    needed = call_isolated(_verdict_and_calls, text, gold, CFG)[1]
    for calls, status in ((needed, "wrong"), (needed - 1, "timeout")):
        cfg = dataclasses.replace(CFG, max_work_calls=calls)
        server = GoldServer(gold, cfg)
        try:
            verdict = pickle.loads(server.call(score_one, text, gold, cfg)[0])
        finally:
            server.close()
        assert verdict.status == status
        assert verdict == score_isolated(text, gold, cfg)


def test_a_gold_whose_reading_runs_out_times_out_every_item_as_its_fork_does():
    gold = "{" * 14 + "42" + "}" * 14  # costly to parse: the gold's own reading runs out
    for cfg in (
        dataclasses.replace(CFG, max_work_calls=5_000),
        dataclasses.replace(CFG, max_work_calls=0, timeout_s=0.2),
    ):
        server = GoldServer(gold, cfg)
        try:
            for text in ("\\boxed{\\frac{84}{2}}", "The answer is $42.0$."):
                verdict = pickle.loads(server.call(score_one, text, gold, cfg)[0])
                assert verdict.status == "timeout"
                assert verdict == score_isolated(text, gold, cfg)
        finally:
            server.close()


def test_a_worker_reads_a_shared_gold_once_and_a_lone_one_in_one_fork():
    isolate.close_gold_server()
    items = [
        ("\\boxed{\\frac{3}{5}}", "0.6"),
        ("\\boxed{0.6}", "0.6"),
        ("\\boxed{\\sqrt{2}}", "0.6"),
    ]
    verdicts, pids = [], []
    for text, gold in items:
        verdicts.append(score_item(text, gold, CFG, gold_shared=True))
        pids.append(isolate._Current.server.pid)
    assert pids[0] == pids[1] == pids[2]
    assert verdicts == [score_isolated(text, gold, CFG) for text, gold in items]
    lone = score_item("\\boxed{\\frac{1}{2}}", "\\frac{2}{4}", CFG)  # not shared: no server
    assert lone.status == "correct"
    assert isolate._Current.server.pid == pids[0]  # the served gold's server is kept
    score_item("\\boxed{\\frac{1}{2}}", "0.5", CFG, gold_shared=True)
    assert isolate._Current.server.pid != pids[0]  # a new gold: a new server
    with pytest.raises(ChildProcessError):
        os.waitpid(pids[0], os.WNOHANG)  # the old one reaped


def test_a_server_killed_under_an_item_is_a_verdict_and_the_next_item_gets_a_new_one():
    isolate.close_gold_server()
    score_item("\\boxed{\\frac{3}{5}}", "0.6", CFG, gold_shared=True)
    killed = isolate._Current.server.pid
    os.kill(killed, signal.SIGKILL)
    verdict = score_item("\\boxed{0.6}", "0.6", CFG, gold_shared=True)
    assert verdict.status == "timeout" and "killed" in verdict.detail  # as a fork killed so
    assert isolate._Current.server is None
    assert score_item("\\boxed{0.6}", "0.6", CFG, gold_shared=True).status == "correct"
    assert isolate._Current.server.pid != killed


def _parent_death_signal() -> int:
    import ctypes

    signal_number = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(signal_number), 0, 0, 0)  # PR_GET_PDEATHSIG
    return signal_number.value


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_forked_item_is_killed_with_its_worker():
    # libc is opened once in the worker (isolate._PRCTL), the death signal set in each child
    # (a fork starts without one).
    assert call_isolated(_parent_death_signal) == signal.SIGKILL
