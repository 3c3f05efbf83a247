from benchmarks import rewards_vs_math_verify as bench
from dynamo_jax.rewards import RewardConfig

CFG = RewardConfig(timeout_s=20.0)
INTEGER = ("So the answer is $\\boxed{12}$.", "12")
FRACTION = ("So the answer is $\\boxed{\\frac{3}{5}}$.", "\\frac{3}{5}")


def test_an_integer_answer_against_an_integer_gold_never_reaches_the_parser():
    assert not bench.needs_parser(*INTEGER, CFG)
    assert bench.needs_parser(*FRACTION, CFG)


def test_the_split_counts_only_the_items_that_need_the_parser_and_times_each_phase():
    split = bench.fork_split([INTEGER[0], FRACTION[0]], [INTEGER[1], FRACTION[1]], CFG)
    assert split["items"] == 1
    assert split["gold parse"] > 0  # timed inside the fork (ns clock)
    # the fork and score_isolated are read from os.times (clock ticks: one fork may show 0);
    # the answer's parse may reuse what the gold's left (math-verify's memo)
    for name in ("fork alone", "answer parse", "verify", "score_isolated"):
        assert split[name] >= 0, name


def test_completions_in_groups_share_a_problem_and_group_one_draws_as_before():
    from benchmarks.rewards import make_completions

    texts, golds = make_completions(24, seed=2, group=8)
    assert all(len(set(golds[i : i + 8])) == 1 for i in range(0, 24, 8))
    assert len(set(texts[:8])) > 1  # the styles still vary within a group
    assert make_completions(10, seed=2, group=1) == make_completions(10, seed=2)


def test_a_workers_cpu_includes_its_live_childrens():
    import os
    import time

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child whose own live child burns CPU; both leave when the pipe closes
        os.close(write_fd)
        if os.fork() == 0:
            end = time.process_time() + 0.5
            while time.process_time() < end:
                pass
        os.read(read_fd, 1)  # returns at the parent's close (or death)
        os._exit(0)
    os.close(read_fd)
    try:
        time.sleep(1.5)
        assert bench._worker_cpu_s(pid) >= 0.4  # all of it in the live grandchild
    finally:
        os.close(write_fd)
        os.waitpid(pid, 0)
