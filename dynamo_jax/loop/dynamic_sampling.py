"""DAPO's dynamic sampling (arXiv 2503.14476, docs/algorithm.md#dynamic-sampling): train only on groups whose
rewards are not all equal, sampling more prompts until the batch holds N of them.

A group whose rewards are all equal has a GRPO advantage of 0 on every token (docs/algorithm.md#grpo-advantages), so it adds
no policy gradient and only dilutes the token mean. With `train.dynamic_sampling`, a step's
requested batch is round 0; while the kept groups do not fill the batch and fewer than
`train.max_sampling_rounds` rounds have been drawn, another round is drawn: the data iterator's
next N prompts, allocated by the configured allocator on the history as of the last finished
step, at the step's temperature, sampled with the round's own seed (seed, step, round) and
scored. At the round limit the step trains on what it has (logged: `dynamic/round_limit_hit`).

Filling the batch: it keeps its fixed B rows (so no function recompiles). Kept groups are taken
in round order, then request order, each whole: a group joins if its rows fit in what is left of
the B rows and its prompt is not in the batch yet (a small dataset can draw a prompt again in a
later round), until there are N groups. With a uniform allocation (n_i = B / N) N groups fill B
exactly; when allocations vary a kept group that does not fit is left out (counted in
`dynamic/not_fitting`) and unfilled rows are padding.

Every generated group, trained or not, updates the allocator history (a dropped group is
evidence about p_i too), round by round. The cost is reported per step: rounds, prompts
generated per kept prompt, rollouts generated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from dynamo_jax.rollout.pipeline import BatchPlan
from dynamo_jax.rollout.protocol import Completion


@dataclasses.dataclass(frozen=True)
class Round:
    """One generation round of a step: its plan, completions and rewards."""

    plan: BatchPlan
    completions: list[Completion]  # grouped by prompt in request order
    rewards: np.ndarray  # float32 [len(completions)]
    verdict_shares: dict  # share of each verdict status among its completions


@dataclasses.dataclass(frozen=True)
class Selection:
    """The groups a step trains on: (round, first completion, end) each, in batch order."""

    groups: tuple[tuple[int, int, int], ...]
    rows: int  # completions they hold
    with_signal: int  # groups of every round whose rewards are not all equal
    not_fitting: int  # of those, left out because their rows did not fit
    repeated: int  # of those, left out because their prompt was already in the batch


def group_slices(prompt_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of equal consecutive prompt ids (a request's completions)."""
    ids = np.asarray(prompt_ids)
    if ids.size == 0:
        return []
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], ids.size]
    return [(int(s), int(e)) for s, e in zip(starts, ends)]


def select_groups(rounds: Sequence[Round], *, max_groups: int, rows: int) -> Selection:
    """Kept groups in round then request order, each whole (module docstring)."""
    chosen, seen = [], set()
    used = with_signal = not_fitting = repeated = 0
    for r, rnd in enumerate(rounds):
        ids = [c.prompt_id for c in rnd.completions]
        for start, end in group_slices(ids):
            rewards = rnd.rewards[start:end]
            if rewards.max() == rewards.min():
                continue
            with_signal += 1
            if len(chosen) == max_groups:
                continue
            if ids[start] in seen:
                repeated += 1
            elif used + (end - start) > rows:
                not_fitting += 1
            else:
                chosen.append((r, start, end))
                seen.add(ids[start])
                used += end - start
    return Selection(tuple(chosen), used, with_signal, not_fitting, repeated)


def sample_rounds(
    first: Round, draw: Callable[[int], Round], *, max_groups: int, rows: int, max_rounds: int
) -> tuple[list[Round], Selection]:
    """Rounds until the selection holds `max_groups` groups, fills `rows`, or `max_rounds`
    rounds were drawn; `draw(r)` generates and scores round r (1, 2, ...)."""
    rounds = [first]
    selection = select_groups(rounds, max_groups=max_groups, rows=rows)
    while len(selection.groups) < max_groups and selection.rows < rows and len(rounds) < max_rounds:
        rounds.append(draw(len(rounds)))
        selection = select_groups(rounds, max_groups=max_groups, rows=rows)
    return rounds, selection


def trained(rounds: Sequence[Round], selection: Selection) -> tuple[list[Completion], np.ndarray]:
    """The selected groups' completions and float32 rewards, in batch order."""
    completions, rewards = [], []
    for r, start, end in selection.groups:
        completions.extend(rounds[r].completions[start:end])
        rewards.append(rounds[r].rewards[start:end])
    return completions, np.concatenate(rewards) if rewards else np.zeros(0, np.float32)


def verdict_shares(rounds: Sequence[Round]) -> dict:
    """Each verdict status's share among all generated completions."""
    total = sum(len(r.completions) for r in rounds)
    keys = rounds[0].verdict_shares
    return {k: sum(r.verdict_shares[k] * len(r.completions) for r in rounds) / total for k in keys}


def metrics(
    rounds: Sequence[Round], selection: Selection, *, max_groups: int, rows: int, max_rounds: int
) -> dict:
    """The step's dynamic-sampling metrics: its cost and what it kept (a step that kept no
    group counts as one kept prompt in `prompts_per_kept`)."""
    prompts = sum(len(r.plan.requests) for r in rounds)
    kept = len(selection.groups)
    return {
        "dynamic/rounds": len(rounds),
        "dynamic/prompts_generated": prompts,
        "dynamic/rollouts_generated": sum(len(r.completions) for r in rounds),
        "dynamic/kept_groups": kept,
        "dynamic/prompts_per_kept": prompts / max(kept, 1),
        "dynamic/groups_with_signal": selection.with_signal,
        "dynamic/not_fitting": selection.not_fitting,
        "dynamic/repeated": selection.repeated,
        "dynamic/round_limit_hit": int(
            kept < max_groups and selection.rows < rows and len(rounds) == max_rounds
        ),
    }
