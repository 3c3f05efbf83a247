"""A gold answer read once, for every completion of its group (isolate.GoldServer).

An item's work is counted from the worker's warm state (isolate.py): its reading of the gold
(normalised, then parsed by math-verify), then its own. A group's completions share one gold,
and parsing it is about a third of an item's CPU (benchmarks/rewards_vs_math_verify.py
--split). `prepare_gold` resets the state as `score_one` does, then reads the gold as the item
would (`math_check.read_gold`), under the item's budget and clock, and records the calls counted
and the outcome. A fork of the process that prepared it then scores one completion with
`score_one(..., prepared=...)`, which, where it would read the gold, takes the recorded outcome
and counts the recorded calls as its own. What it did before that point (its text's
normalisation and screens) runs after the gold's reading instead of before; the caches both
fill (`re`'s, SymPy's) cost the same calls whichever fills them first, so the item counts
exactly the calls, and gets the verdict, of `isolate.score_isolated`
(tests/test_rewards_isolate.py compares both on every item).
"""

from __future__ import annotations

import dataclasses

from dynamo_jax.rewards import budget
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.math_check import DeadlineExceeded, _reset_state, read_gold, time_limit


def _nothing() -> None:
    """A call that does nothing: what a counted block costs around its function."""


@dataclasses.dataclass(frozen=True)
class PreparedGold:
    """One gold read as `score_one` would have read it, and the calls that reading counted."""

    gold: str  # as the data gives it
    read: tuple[str, list] | None  # read_gold's result; None where it raised
    error: BaseException | None  # what reading it raised (raised again for every item)
    calls: int  # counted calls of the reading, less the frames `take` stands in for them with
    exceeded: bool  # the reading alone ran out of the item's budget

    def take(self) -> tuple[str, list]:
        """The reading, counted against the current item (in place of `read_gold`'s call)."""
        budget.add_prior_work(self.calls, self.exceeded)
        if self.error is not None:
            raise self.error
        if self.read is None:  # cut by the budget check: the item is a timeout
            raise budget.WorkBudgetExceeded()
        return self.read


def prepare_gold(gold: str, cfg: RewardConfig) -> PreparedGold:
    """Reset the state as `score_one` does, then read `gold` as its items would (see above)."""
    if cfg.answer_format != "math":
        raise ValueError("a prepared gold is for answer_format='math' (number mode reads less)")
    _reset_state()
    read, error, calls = None, None, 0
    try:
        with time_limit(cfg.timeout_s):
            if not cfg.max_work_calls:
                read = read_gold(gold)
            else:
                try:
                    budget.calls_made(_nothing)  # the count's own frames, in the same state
                    around = budget.last_made() - 1
                    with budget.work_budget(cfg.max_work_calls):
                        read = read_gold(gold)
                finally:
                    # `take` and `add_prior_work`: two frames where `read_gold`'s was one.
                    calls = budget.last_made() - around - 2
    except (Exception, RecursionError, MemoryError, DeadlineExceeded) as exc:
        error = exc
    except budget.WorkBudgetExceeded:
        pass
    exceeded = bool(cfg.max_work_calls) and budget.exceeded()
    return PreparedGold(gold, read, error, calls, exceeded)
