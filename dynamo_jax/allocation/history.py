"""Per-prompt rollout history, held as flat NumPy arrays indexed by the dense prompt index.

The data layer gives every dataset row a stable 64-bit prompt id and a dense index
0..num_prompts-1; everything here is keyed by the dense index, so a step's update is a handful
of vectorised scatter-adds however large the dataset (100k+ prompts cost a few MB).

What is tracked (docs/algorithm.md#water-level-allocation, docs/algorithm.md#e3-allocation):
- `generated`, `correct`: G_i and k_i for DynaMO's priority, with the optional decay of old
  counts (G_i <- decay·G_i + n_i at each step the prompt is in).
- `total_generated`, `total_reward`: undecayed totals; E3's difficulty is the cumulative mean
  reward total_reward / total_generated.
- `epoch_generated`, `epoch_above_mean`: this epoch's rollouts and how many had a reward above
  their batch's mean (the released heuristic's "acc"), reset by `end_epoch`.
- `released_priority`, `e3_rank`: per-epoch quantities written by the allocators'
  `on_epoch_end` hooks; `epochs_completed` drives E3's curriculum.
- `entropy_mean`: H̄_i, the mean token entropy of the prompt's most recent rollouts (NaN until
  one is recorded), for the entropy factor of docs/algorithm.md#allocation-variants.
"""

from __future__ import annotations

import numpy as np

# name -> dtype of every per-prompt array; the state dict holds exactly these plus the counter.
_ARRAYS: dict[str, type] = {
    "generated": np.float64,
    "correct": np.float64,
    "total_generated": np.int64,
    "total_reward": np.float64,
    "visits": np.int64,
    "epoch_generated": np.int64,
    "epoch_above_mean": np.int64,
    "released_priority": np.float64,
    "e3_rank": np.float64,
    "entropy_mean": np.float64,
}
# Arrays added after checkpoints were first written, with the value a state saved without
# them restores to (NaN entropy = none recorded yet).
_ADDED_LATER: dict[str, float] = {"entropy_mean": np.nan}
# A prompt never scored by the released heuristic counts as maximally informative
# (4·acc·(1-acc) peaks at 1), so it is not starved before its first epoch ends.
RELEASED_PRIORITY_UNKNOWN = 1.0


def check_indices(indices: np.ndarray, num_prompts: int, what: str = "indices") -> np.ndarray:
    """Dense prompt indices as int64, each in range and none repeated within one batch."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(
            f"{what}: expected a 1-D integer array, got dtype {idx.dtype} shape {idx.shape}"
        )
    idx = idx.astype(np.int64)
    bad = np.flatnonzero((idx < 0) | (idx >= num_prompts))
    if bad.size:
        raise ValueError(
            f"{what}[{bad[0]}] = {idx[bad[0]]} is not a dense prompt index in [0, {num_prompts})"
        )
    uniq, counts = np.unique(idx, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(
            f"{what}: prompt index {uniq[counts > 1][0]} appears "
            f"{counts[counts > 1][0]} times in one batch"
        )
    return idx


def _column(values, n: int, name: str, dtype) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"PromptHistory.update: {name} has shape {arr.shape}, expected ({n},)")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"PromptHistory.update: {name}[{bad[0]}] = {arr[bad[0]]} is not finite")
    if dtype is np.int64:
        bad = np.flatnonzero(arr != np.round(arr))
        if bad.size:
            raise ValueError(
                f"PromptHistory.update: {name}[{bad[0]}] = {arr[bad[0]]} is not an integer count"
            )
        return arr.astype(np.int64)
    return arr


def _entropy_column(values, n: int, idx: np.ndarray) -> np.ndarray | None:
    """Per-prompt mean entropies: each NaN (none this step) or finite and >= 0."""
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(
            f"PromptHistory.update: entropy_mean has shape {arr.shape}, expected ({n},)"
        )
    bad = np.flatnonzero(~np.isnan(arr) & ~(np.isfinite(arr) & (arr >= 0)))
    if bad.size:
        i = bad[0]
        raise ValueError(
            f"PromptHistory.update: entropy_mean[{i}] (prompt index {idx[i]}) = {arr[i]}; "
            "need a finite entropy >= 0, or NaN for none"
        )
    return arr


class PromptHistory:
    """Rollout statistics for every prompt of the dataset (see the module docstring)."""

    def __init__(self, num_prompts: int, decay: float = 1.0):
        if int(num_prompts) < 1:
            raise ValueError(f"PromptHistory.num_prompts must be >= 1, got {num_prompts}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"PromptHistory.decay must be in (0, 1], got {decay}")
        self.num_prompts = int(num_prompts)
        self.decay = float(decay)
        for name, dtype in _ARRAYS.items():
            setattr(self, name, np.zeros(self.num_prompts, dtype=dtype))
        self.released_priority[:] = RELEASED_PRIORITY_UNKNOWN
        self.entropy_mean[:] = np.nan
        self.epochs_completed = 0

    def update(
        self,
        indices: np.ndarray,
        n_generated: np.ndarray,
        n_correct: np.ndarray,
        reward_sum: np.ndarray,
        n_above_batch_mean: np.ndarray | None = None,
        entropy_mean: np.ndarray | None = None,
    ) -> None:
        """Fold one step's results in: n_i rollouts, c_i correct, reward sum r_i per prompt.

        `n_above_batch_mean` (the released heuristic's "acc" numerator: rollouts whose reward
        exceeds the mean reward of the whole batch) defaults to the binary-reward value: a
        reward of 1 is above the batch mean unless every rollout of the batch was correct.
        `entropy_mean` (float [n], the mean token entropy of each prompt's rollouts this step)
        replaces the stored H̄_i; NaN (or None for all) means no entropy for that prompt this
        step, and its previous value is kept.
        """
        idx = check_indices(indices, self.num_prompts, "PromptHistory.update: indices")
        n = idx.size
        gen = _column(n_generated, n, "n_generated", np.int64)
        cor = _column(n_correct, n, "n_correct", np.int64)
        rew = _column(reward_sum, n, "reward_sum", np.float64)
        bad = np.flatnonzero((gen < 0) | (cor < 0) | (cor > gen))
        if bad.size:
            i = bad[0]
            raise ValueError(
                f"PromptHistory.update: row {i} (prompt index {idx[i]}) has "
                f"n_correct={cor[i]}, n_generated={gen[i]}; need 0 <= n_correct <= "
                "n_generated"
            )
        if n_above_batch_mean is None:
            total = gen.sum()
            all_correct = total > 0 and cor.sum() == total
            above = np.zeros_like(cor) if all_correct else cor
        else:
            above = _column(n_above_batch_mean, n, "n_above_batch_mean", np.int64)
            bad = np.flatnonzero((above < 0) | (above > gen))
            if bad.size:
                raise ValueError(
                    f"PromptHistory.update: n_above_batch_mean[{bad[0]}] = "
                    f"{above[bad[0]]} is outside [0, n_generated={gen[bad[0]]}]"
                )
        entropy = _entropy_column(entropy_mean, n, idx)
        self.generated[idx] = self.decay * self.generated[idx] + gen
        self.correct[idx] = self.decay * self.correct[idx] + cor
        self.total_generated[idx] += gen
        self.total_reward[idx] += rew
        self.visits[idx] += 1
        self.epoch_generated[idx] += gen
        self.epoch_above_mean[idx] += above
        if entropy is not None:
            has = ~np.isnan(entropy)
            self.entropy_mean[idx[has]] = entropy[has]

    def end_epoch(self) -> None:
        """Close a pass over the dataset: count it and reset the per-epoch accumulators."""
        self.epochs_completed += 1
        self.epoch_generated[:] = 0
        self.epoch_above_mean[:] = 0

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume, as NumPy arrays (copies) for the checkpoint."""
        state = {name: getattr(self, name).copy() for name in _ARRAYS}
        state["epochs_completed"] = np.asarray(self.epochs_completed, dtype=np.int64)
        return state

    @classmethod
    def from_state_dict(
        cls, state: dict[str, np.ndarray], decay: float = 1.0, num_prompts: int | None = None
    ) -> PromptHistory:
        """Rebuild from `state_dict()`; `num_prompts` (if given) must match the saved size.

        A state saved before an array of `_ADDED_LATER` existed restores it to its default.
        """
        expected = set(_ARRAYS) | {"epochs_completed"}
        missing = expected - set(state) - set(_ADDED_LATER)
        unexpected = set(state) - expected
        if missing or unexpected:
            raise ValueError(
                f"PromptHistory state: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
            )
        size = np.asarray(state["generated"]).shape
        if len(size) != 1 or size[0] < 1:
            raise ValueError(f"PromptHistory state: 'generated' has shape {size}, expected (N,)")
        if num_prompts is not None and size[0] != num_prompts:
            raise ValueError(
                f"PromptHistory state holds {size[0]} prompts but the dataset has "
                f"{num_prompts}; was the checkpoint made with another dataset?"
            )
        history = cls(size[0], decay)
        for name, dtype in _ARRAYS.items():
            if name not in state:
                getattr(history, name)[:] = _ADDED_LATER[name]
                continue
            arr = np.asarray(state[name])
            if arr.shape != size:
                raise ValueError(
                    f"PromptHistory state: '{name}' has shape {arr.shape}, expected {size}"
                )
            setattr(history, name, arr.astype(dtype, copy=True))
        history.epochs_completed = int(np.asarray(state["epochs_completed"]))
        return history
