"""Epoch-based shuffled iteration over dataset rows, checkpointable and sliced per host.

Every host builds the same iterator (same seed) and computes the same global permutation
(`numpy.random.default_rng([seed, epoch])`), so no communication is needed; host p takes the
p-th contiguous block of each global batch. The state is (epoch, position, seed): `position`
counts global batches already handed out in the current epoch, so a resumed run continues with
exactly the batch it would have produced next, on any number of hosts that divides the batch.

The last partial batch of an epoch is dropped (a different subset each epoch, as the order is
reshuffled). The batch that ends an epoch carries `epoch_end=True`, the caller's cue for
end-of-epoch hooks (E3's difficulty re-ranking, curricula).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Batch:
    """This host's rows of one global batch (dense row indices), and where it sits."""

    indices: np.ndarray  # int64 [batch_size // process_count]
    epoch: int
    step_in_epoch: int
    epoch_end: bool


class EpochIterator:
    """Endless iterator of `Batch`es over `num_rows` rows, reshuffled every epoch."""

    def __init__(
        self,
        num_rows: int,
        batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if num_rows < 1 or batch_size < 1:
            raise ValueError(
                f"EpochIterator: num_rows={num_rows} and batch_size={batch_size} must be >= 1"
            )
        if batch_size > num_rows:
            raise ValueError(f"EpochIterator: batch_size={batch_size} exceeds num_rows={num_rows}")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(
                f"EpochIterator: process_index={process_index} must lie in [0, process_count={process_count})"
            )
        if batch_size % process_count:
            raise ValueError(
                f"EpochIterator: batch_size={batch_size} must be divisible by process_count={process_count}"
            )
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.seed = int(seed)
        self.process_index = process_index
        self.process_count = process_count
        self.epoch = 0
        self.position = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    @property
    def batches_per_epoch(self) -> int:
        return self.num_rows // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The global row order of `epoch` (same on every host)."""
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(self.num_rows).astype(np.int64)
            self._order_epoch = epoch
        return self._order

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Batch:
        start = self.position * self.batch_size
        global_rows = self.epoch_order(self.epoch)[start : start + self.batch_size]
        per_host = self.batch_size // self.process_count
        mine = global_rows[self.process_index * per_host : (self.process_index + 1) * per_host]
        batch = Batch(
            indices=mine.copy(),
            epoch=self.epoch,
            step_in_epoch=self.position,
            epoch_end=self.position + 1 == self.batches_per_epoch,
        )
        self.position += 1
        if batch.epoch_end:
            self.epoch, self.position = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        missing = {"epoch", "position", "seed"} - set(state)
        if missing:
            raise ValueError(f"EpochIterator.load_state_dict: missing {sorted(missing)}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.batches_per_epoch:
            raise ValueError(
                f"EpochIterator.load_state_dict: epoch={epoch}, position={position} out of range "
                f"({self.batches_per_epoch} batches per epoch)"
            )
        self.epoch, self.position, self.seed = epoch, position, int(state["seed"])
        self._order_epoch = -1
