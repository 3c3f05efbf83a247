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
