"""Sequences → rows of the jitted functions' batch: bin packing and the micro-batch layout.

A row has `row_len` token slots. Packed (`RowLayout.packing`), whole sequences are laid end to
end in a row: each token carries its sequence's segment id (1, 2, ... in placement order within
the row; 0 = an empty slot) and its position within its sequence (RoPE restarts at 0 for every
sequence). The model attends within a segment only (models/qwen.py) and every per-sequence
reduction of the losses is per segment (losses/batch.py), so packing is a layout, not an
algorithm (docs/algorithm.md#packed-sequences). Unpacked, each sequence has a row of its own: the same encoding
with one segment per row, which is today's padded batch.

Bin packing is best-fit decreasing: sequences longest first (ties by index), each into the row
whose free space is the smallest that still holds it (ties: the lower row), else a new row. It
has first-fit decreasing's guarantee (at most 11/9 of the optimal row count + 6/9) and usually
fills rows at least as well. It is deterministic, so every process of a multi-process run,
holding the same rollout batch, builds the same rows and feeds its own slice of them.

Micro-batches: the filled rows are cut into micro-batches of `micro_rows` rows, the k-th row of
micro-batch m stored at row k·M + m of the batch, which is exactly how the jitted functions split
a batch (step/forward.py `split_micro`: strided, so each device's contiguous rows hold its share
of every micro-batch). The row count varies with the sequences' lengths, and every distinct batch
shape is one more compiled program, so it is rounded up (`rows_for`):
- more rows than one micro-batch: the micro-batch count M is rounded up to a power of two,
  capped at the most the layout can need (`max_micro_batches`: every sequence alone in a row).
  The padding micro-batches hold no token and the jitted functions skip them, so they cost only
  their transfer: at most ⌈log2 M_max⌉ + 1 programs, for free.
- at most one micro-batch: the rows are rounded up to a multiple of `row_step` (an eighth of a
  micro-batch, whole rows per device), since empty rows inside a micro-batch are computed like
  full ones: at most 8 more programs, at most an eighth of a micro-batch of padding rows.
A run's row counts vary little from step to step, so it usually compiles one or two programs
per jitted function (a persistent compilation cache makes restarts cheap).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """The geometry of one call's rows (a mini-batch, or the whole rollout batch for the log-prob
    pass): row length, packing, micro-batch rows, row shards. `place` puts sequences into it."""

    row_len: int  # L: token slots per row (train.pack_len, default the run's max_seq_len)
    packing: bool  # several whole sequences per row; False: one sequence per row
    micro_rows: int  # rows per micro-batch, all devices together
    max_sequences: int  # the most sequences one call holds (bounds the micro-batch count)
    row_shards: int = 1  # devices the rows are split over: every row count is a multiple of it
    # Shared prompts (train.share_prompts; models/qwen.py SharedPrompts), unpacked rows only:
    # every sequence's prompt ends at slot prompt_slots - 1 (its response starts at prompt_slots),
    # and a micro-batch holds at most prompt_groups distinct prompts. 0: off.
    prompt_slots: int = 0
    prompt_groups: int = 0

    def __post_init__(self):
        for name in ("row_len", "micro_rows", "max_sequences", "row_shards"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"RowLayout.{name} must be a positive int, got {value!r}")
        if self.prompt_slots or self.prompt_groups:
            if self.packing:
                raise ValueError("RowLayout: shared prompts need one sequence per row (no packing)")
            if not 0 < self.prompt_slots < self.row_len:
                raise ValueError(
                    f"RowLayout.prompt_slots must be in 1..{self.row_len - 1}, "
                    f"got {self.prompt_slots!r}"
                )
            if not 0 < self.prompt_groups <= self.micro_rows:
                raise ValueError(
                    f"RowLayout.prompt_groups must be in 1..{self.micro_rows} (micro_rows), "
                    f"got {self.prompt_groups!r}"
                )
        if self.micro_rows % self.row_shards:
            raise ValueError(
                f"RowLayout.micro_rows ({self.micro_rows}) must be a multiple of row_shards "
                f"({self.row_shards}): each device holds whole rows of every micro-batch"
            )

    @property
    def shared_prompts(self) -> tuple[int, int] | None:
        """(P prompt slots, G prompts per micro-batch) with shared prompts, else None."""
        return (self.prompt_slots, self.prompt_groups) if self.prompt_slots else None

    @property
    def row_step(self) -> int:
        """Row granularity of a single micro-batch: an eighth of it, in whole rows per device."""
        per_device = self.micro_rows // self.row_shards
        return self.row_shards * math.ceil(per_device / 8)

    @property
    def max_micro_batches(self) -> int:
        """M_max: the micro-batches of the worst case, every sequence alone in a row."""
        return math.ceil(self.max_sequences / self.micro_rows)

    @property
    def max_rows(self) -> int:
        return self.max_micro_batches * self.micro_rows

    def micro_batches_for(self, filled_rows: int) -> int:
        """M for `filled_rows` rows: the next power of two, capped at `max_micro_batches`."""
        needed = max(math.ceil(filled_rows / self.micro_rows), 1)
        if needed > self.max_micro_batches:
            raise ValueError(
                f"{filled_rows} rows need {needed} micro-batches of {self.micro_rows} rows, more "
                f"than the layout's {self.max_micro_batches} (max_sequences {self.max_sequences})"
            )
        return min(1 << (needed - 1).bit_length(), self.max_micro_batches)

    def rows_for(self, filled_rows: int) -> tuple[int, int]:
        """(rows R, micro-batches M) of a call whose sequences fill `filled_rows` rows."""
        if filled_rows <= self.micro_rows:
            steps = max(math.ceil(filled_rows / self.row_step), 1)
            return min(steps * self.row_step, self.micro_rows), 1
        m = self.micro_batches_for(filled_rows)
        return m * self.micro_rows, m

    def place(self, lengths_S, prompt_lengths_S=None) -> Placement:
        """Where each sequence goes. `lengths_S`: tokens per sequence (0: left out, no tokens);
        `prompt_lengths_S`: its prompt's tokens, needed with shared prompts (each sequence then
        starts at slot prompt_slots - its prompt length)."""
        lengths = np.asarray(lengths_S, np.int64).reshape(-1)
        if len(lengths) > self.max_sequences:
            raise ValueError(
                f"{len(lengths)} sequences exceed the layout's max_sequences {self.max_sequences}"
            )
        bad = np.flatnonzero((lengths < 0) | (lengths > self.row_len))
        if len(bad):
            s = int(bad[0])
            raise ValueError(
                f"sequence {s} has {int(lengths[s])} tokens; a row holds 0..{self.row_len} "
                "(train.pack_len must be >= the run's max_seq_len)"
            )
        if self.packing:
            fill_row, offset = best_fit_decreasing(lengths, self.row_len)
        else:  # one row per sequence, empty ones included: the row count is fixed
            fill_row, offset = np.arange(len(lengths)), np.zeros(len(lengths), np.int64)
            if self.prompt_slots:
                offset = self._prompt_offsets(lengths, prompt_lengths_S)
        filled = int(fill_row.max()) + 1 if len(fill_row) else 0
        rows, m = self.rows_for(filled)
        row = np.where(
            fill_row >= 0, (fill_row % self.micro_rows) * m + fill_row // self.micro_rows, -1
        )
        return Placement(row, offset, lengths, rows, self.row_len, m)

    def _prompt_offsets(self, lengths: np.ndarray, prompt_lengths_S) -> np.ndarray:
        """Each sequence's first slot, so that its prompt ends at slot prompt_slots - 1."""
        if prompt_lengths_S is None:
            raise ValueError("RowLayout.place: shared prompts need the prompt lengths")
        prompt = np.asarray(prompt_lengths_S, np.int64).reshape(-1)
        offset = np.where(lengths > 0, self.prompt_slots - prompt, 0)
        bad = (offset < 0) | (prompt < 1) | (prompt > lengths) | (offset + lengths > self.row_len)
        bad = np.flatnonzero(bad & (lengths > 0))
        if len(bad):
            s = int(bad[0])
            raise ValueError(
                f"sequence {s} ({int(prompt[s])} prompt tokens of {int(lengths[s])}) does not fit "
                f"rows whose prompts end at slot {self.prompt_slots} of {self.row_len}"
            )
        return offset


def best_fit_decreasing(lengths_S: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, offset) per sequence; row -1 for length-0 sequences. Rows are numbered in the order
    they are opened, so row 0 holds the longest sequence."""
    n = len(lengths_S)
    row = np.full(n, -1, np.int64)
    offset = np.zeros(n, np.int64)
    free: list[tuple[int, int]] = []  # (free slots, row), sorted; full rows are dropped
    opened = 0
    for s in np.lexsort((np.arange(n), -lengths_S)):  # longest first, ties by index
        need = int(lengths_S[s])
        if need == 0:
            break  # sorted: only empty sequences remain
        i = bisect.bisect_left(free, (need, -1))  # the tightest row that still fits
        if i == len(free):
            r, left = opened, capacity
            opened += 1
        else:
            left, r = free.pop(i)
        row[s], offset[s] = r, capacity - left
        if left > need:
            bisect.insort(free, (left - need, r))
    return row, offset


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each sequence of one call sits in its `RowLayout`'s rows (`RowLayout.place`):
    sequence s occupies slots [offset_S[s], offset_S[s] + length_S[s]) of row row_S[s] (-1: left
    out). `rows` = micro_batches · micro_rows (padding rows empty)."""

    row_S: np.ndarray  # int64 [S]
    offset_S: np.ndarray  # int64 [S]
    length_S: np.ndarray  # int64 [S]
    rows: int  # R
    row_len: int  # L
    micro_batches: int  # M

    @functools.cached_property
    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sequence, position in it, flat slot of the [R, L] rows) for every placed token."""
        placed = np.flatnonzero((self.row_S >= 0) & (self.length_S > 0))
        lens = self.length_S[placed]
        seq = np.repeat(placed, lens)
        pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        start = self.row_S[placed] * self.row_len + self.offset_S[placed]
        return seq, pos, np.repeat(start, lens) + pos

    @property
    def tokens(self) -> int:
        """Real tokens placed (all rows together)."""
        return len(self._index[0])

    @property
    def padding_share(self) -> float:
        """Share of the R·L slots that hold no token."""
        return 1.0 - self.tokens / (self.rows * self.row_len)

    def scatter(self, values_SxW, fill=0) -> np.ndarray:
        """Per-sequence token arrays (sequence s's tokens first in its row of `values_SxW`) →
        [R, L] rows; empty slots hold `fill`."""
        values = np.asarray(values_SxW)
        seq, pos, slot = self._index
        out = np.full(self.rows * self.row_len, fill, values.dtype)
        out[slot] = values[seq, pos]
        return out.reshape(self.rows, self.row_len)

    def broadcast(self, values_S, fill=0) -> np.ndarray:
        """One value per sequence → [R, L]: the value on each of its tokens."""
        values = np.asarray(values_S)
        seq, _, slot = self._index
        out = np.full(self.rows * self.row_len, fill, values.dtype)
        out[slot] = values[seq]
        return out.reshape(self.rows, self.row_len)

    def gather(self, rows_RxL, width: int, fill=0) -> np.ndarray:
        """Inverse of `scatter`: [R, L] rows → [S, width] per-sequence arrays (left-aligned)."""
        rows = np.asarray(rows_RxL).reshape(-1)
        seq, pos, slot = self._index
        out = np.full((len(self.length_S), width), fill, rows.dtype)
        out[seq, pos] = rows[slot]
        return out

    def prompt_tables(self, prompt_id_S, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """(prompt_table, prompt_source), int32 [R] each (step/forward.py), for sequences
        whose prompts are `prompt_id_S`: per micro-batch (rows k·M + m, k = 0, 1, ...), entry
        g < `groups` of its table is the micro-batch row holding its g-th distinct prompt (in row
        order; unused entries 0), and each row's source is its prompt's g (empty rows 0).
        Raises ValueError when a micro-batch holds more than `groups` distinct prompts."""
        ids = np.asarray(prompt_id_S)
        m = self.micro_batches
        row_id = np.full(self.rows, -1, np.int64)
        placed = (self.row_S >= 0) & (self.length_S > 0)
        row_id[self.row_S[placed]] = ids[placed]
        table = np.zeros(self.rows, np.int32)
        source = np.zeros(self.rows, np.int32)
        for micro in range(m):
            local = row_id[micro::m]  # row k of this micro-batch is row k·M + micro
            real = np.flatnonzero(local >= 0)
            uniq, first, inverse = np.unique(local[real], return_index=True, return_inverse=True)
            if len(uniq) > groups:
                raise ValueError(
                    f"a micro-batch holds {len(uniq)} distinct prompts, more than the "
                    f"{groups} the shared-prompt layout was built for"
                )
            order = np.argsort(first, kind="stable")  # distinct prompts in row order
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            table[micro::m][: len(uniq)] = real[first[order]]
            source[micro::m][real] = rank[inverse]
        return table, source

    def shared_prompt_tables(
        self, prompt_id_S, tokens_SxW, mask_SxW, slots: int, groups: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`prompt_tables`, after checking that the rows said to share a prompt hold the very same
        first `slots` token slots (`tokens_SxW` under `mask_SxW`): the model runs one of them."""
        table, source = self.prompt_tables(prompt_id_S, groups)
        m = self.micro_batches
        tokens = self.scatter(tokens_SxW)[:, :slots]
        mask = self.scatter(mask_SxW)[:, :slots]
        # Row r = k·M + micro reads its micro-batch's table entry source[r]: row entry·M + micro.
        local = table.reshape(-1, m)[source.reshape(-1, m), np.arange(m)].reshape(-1)
        holder = local * m + np.arange(self.rows) % m
        same = (mask == mask[holder]).all(axis=1) & (tokens == tokens[holder]).all(axis=1)
        differs = np.flatnonzero(~same & mask.any(axis=1))  # empty rows read any prompt, unused
        if len(differs):
            raise ValueError(
                f"rows {int(differs[0])} and {int(holder[differs[0]])} of a shared-prompt layout "
                "have the same prompt id but different prompt tokens"
            )
        return table, source

    def positions(self) -> np.ndarray:
        """int32 [R, L]: each token's position in its sequence (0 on empty slots)."""
        seq, pos, slot = self._index
        out = np.zeros(self.rows * self.row_len, np.int32)
        out[slot] = pos
        return out.reshape(self.rows, self.row_len)

    def segment_ids(self) -> np.ndarray:
        """int32 [R, L]: 1, 2, ... for the sequences of a row in slot order; 0 on empty slots."""
        placed = np.flatnonzero((self.row_S >= 0) & (self.length_S > 0))
        order = placed[np.lexsort((self.offset_S[placed], self.row_S[placed]))]
        rows_in_order = self.row_S[order]
        first = np.r_[True, rows_in_order[1:] != rows_in_order[:-1]]
        run_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        segment = np.zeros(len(self.length_S), np.int32)
        segment[order] = np.arange(len(order)) - run_start + 1
        return self.broadcast(segment)
