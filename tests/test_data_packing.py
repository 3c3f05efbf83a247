"""Bin packing and the micro-batch row layout (dynamo_jax/data/packing.py).

Oracles: the invariants a layout must keep (every token placed once, no overlap, rows within
capacity, the strided micro-batch order of step/forward.py), a brute-force optimum on small
inputs for the packing quality, and hand-worked layouts.
"""

import itertools

import numpy as np
import pytest

from dynamo_jax.data.packing import RowLayout, best_fit_decreasing


def _check_placement(placement, lengths, layout):
    """Every sequence's tokens sit in one row, inside the row, without overlap."""
    occupied = np.zeros((placement.rows, placement.row_len), np.int64)
    for s, n in enumerate(lengths):
        if n == 0 and layout.packing:
            assert placement.row_S[s] == -1
            continue
        r, o = placement.row_S[s], placement.offset_S[s]
        assert 0 <= r < placement.rows and o + n <= placement.row_len
        occupied[r, o : o + n] += 1
    assert occupied.max() <= 1
    assert placement.tokens == int(np.sum(lengths)) == occupied.sum()


def test_hand_worked_layout_segments_positions_and_strided_micro_batches():
    # Capacity 10; lengths 6, 3, 4, 7, 2. Best fit decreasing, longest first:
    #   7 (s3) → row 0 (3 left); 6 (s0) → row 1 (4 left); 4 (s2) → row 1 (tightest: 4, 0 left);
    #   3 (s1) → row 0 (3 left → 0); 2 (s4) → row 2. Three filled rows.
    layout = RowLayout(row_len=10, packing=True, micro_rows=2, max_sequences=8)
    placement = layout.place([6, 3, 4, 7, 2])
    # 3 rows need 2 micro-batches of 2 rows (M = 2); filled row j goes to global row
    # (j % 2) * M + j // 2: filled rows 0, 1, 2 → global rows 0, 2, 1.
    assert placement.micro_batches == 2 and placement.rows == 4
    np.testing.assert_array_equal(placement.row_S, [2, 0, 2, 0, 1])
    np.testing.assert_array_equal(placement.offset_S, [0, 7, 6, 0, 0])
    seg = placement.segment_ids()
    np.testing.assert_array_equal(seg[0], [1] * 7 + [2] * 3)  # s3 then s1
    np.testing.assert_array_equal(seg[2], [1] * 6 + [2] * 4)  # s0 then s2
    np.testing.assert_array_equal(seg[1], [1, 1] + [0] * 8)  # s4, then empty slots
    np.testing.assert_array_equal(seg[3], [0] * 10)  # a padding row of micro-batch 1
    pos = placement.positions()
    np.testing.assert_array_equal(pos[0], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2])
    # 22 tokens in 4 rows of 10 slots.
    assert placement.tokens == 22 and placement.padding_share == pytest.approx(1 - 22 / 40)


def test_scatter_gather_broadcast_round_trip():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 13, 40)
    values = rng.normal(size=(40, 12)).astype(np.float32)
    layout = RowLayout(row_len=16, packing=True, micro_rows=3, max_sequences=40)
    placement = layout.place(lengths)
    _check_placement(placement, lengths, layout)
    rows = placement.scatter(values, fill=-1.0)
    back = placement.gather(rows, 12, fill=0.0)
    keep = np.arange(12)[None] < lengths[:, None]
    np.testing.assert_array_equal(back[keep], values[keep])
    assert np.all(back[~keep] == 0.0)
    # Slots without a token hold the fill; a sequence's value lands on each of its tokens.
    seg = placement.segment_ids()
    assert np.all(rows[seg == 0] == -1.0) and np.all((seg > 0).sum() == lengths.sum())
    per_token = placement.broadcast(np.arange(40), fill=-1)
    for s in np.flatnonzero(lengths):
        r, o = placement.row_S[s], placement.offset_S[s]
        assert np.all(per_token[r, o : o + lengths[s]] == s)


def test_unpacked_layout_is_one_sequence_per_row_in_fixed_rows():
    lengths = [5, 0, 8, 3]
    layout = RowLayout(row_len=8, packing=False, micro_rows=2, max_sequences=4)
    placement = layout.place(lengths)
    assert placement.rows == 4 and placement.micro_batches == 2  # the row count never varies
    _check_placement(placement, lengths, layout)
    # Sequence j is filled row j: global row (j % 2) * 2 + j // 2.
    np.testing.assert_array_equal(placement.row_S, [0, 2, 1, 3])
    seg = placement.segment_ids()
    assert set(np.unique(seg)) == {0, 1} and seg[2].sum() == 0  # the empty sequence's row


@pytest.mark.parametrize("seed", range(20))
def test_packing_is_valid_and_near_optimal(seed):
    """Rows never overflow, and best fit decreasing uses at most FFD's bound of the optimum
    (11/9 · OPT + 6/9 rows), checked against a brute-force optimum on 7 sequences."""
    rng = np.random.default_rng(seed)
    capacity = 10
    lengths = rng.integers(1, capacity + 1, 7)
    row, offset = best_fit_decreasing(lengths, capacity)
    used = row.max() + 1
    fill = np.bincount(row, weights=lengths, minlength=used)
    assert fill.max() <= capacity
    best = _optimal_rows(lengths, capacity)
    assert used <= 11 / 9 * best + 6 / 9
    assert used >= int(np.ceil(lengths.sum() / capacity))


def _optimal_rows(lengths, capacity):
    n = len(lengths)
    for k in range(1, n + 1):
        for assign in itertools.product(range(k), repeat=n):
            if np.bincount(assign, weights=lengths, minlength=k).max() <= capacity:
                return k
    raise AssertionError


def test_deterministic_and_independent_of_equal_length_ties():
    lengths = np.array([4, 4, 4, 2, 2, 9, 1, 4])
    layout = RowLayout(row_len=10, packing=True, micro_rows=1, max_sequences=8)
    a, b = layout.place(lengths), layout.place(lengths.copy())
    np.testing.assert_array_equal(a.row_S, b.row_S)
    np.testing.assert_array_equal(a.offset_S, b.offset_S)
    # Equal lengths are placed in index order: sequence 0 before 1 before 2 before 7.
    order = np.lexsort((a.offset_S, a.row_S))
    fours = [s for s in order if lengths[s] == 4]
    assert fours == [0, 1, 2, 7]


def test_micro_batch_count_is_a_capped_power_of_two():
    layout = RowLayout(row_len=8, packing=True, micro_rows=4, max_sequences=24)
    assert layout.max_micro_batches == 6 and layout.max_rows == 24
    got = [layout.micro_batches_for(n) for n in (0, 1, 4, 5, 8, 9, 13, 16, 17, 24)]
    assert got == [1, 1, 1, 2, 2, 4, 4, 4, 6, 6]
    with pytest.raises(ValueError, match="more than the layout's 6"):
        layout.micro_batches_for(25)


def test_too_long_or_too_many_sequences_fail_with_the_culprit():
    layout = RowLayout(row_len=8, packing=True, micro_rows=2, max_sequences=3)
    with pytest.raises(ValueError, match=r"sequence 1 has 9 tokens; a row holds 0..8"):
        layout.place([3, 9])
    with pytest.raises(ValueError, match="4 sequences exceed the layout's max_sequences 3"):
        layout.place([1, 1, 1, 1])
    with pytest.raises(ValueError, match="RowLayout.micro_rows must be a positive int"):
        RowLayout(row_len=8, packing=True, micro_rows=0, max_sequences=3)


def test_one_micro_batch_is_cut_to_an_eighth_of_it_in_whole_rows_per_device():
    """Empty rows inside a micro-batch cost full compute, so a call that fits one micro-batch
    gets only the rows it needs, rounded up to a multiple of row_step: ⌈micro rows per device
    / 8⌉ rows on each of the row_shards devices."""
    layout = RowLayout(row_len=8, packing=True, micro_rows=16, max_sequences=64, row_shards=2)
    assert layout.row_step == 2  # 8 rows per device / 8 = 1 row on each of 2 devices
    got = [layout.rows_for(n) for n in (0, 1, 5, 16, 17, 33)]
    assert got == [(2, 1), (2, 1), (6, 1), (16, 1), (32, 2), (64, 4)]
    wide = RowLayout(row_len=8, packing=True, micro_rows=64, max_sequences=64)
    assert wide.row_step == 8
    assert [wide.rows_for(n)[0] for n in (1, 30, 57, 64)] == [8, 32, 64, 64]
    # Best fit decreasing, capacity 8: 8 (s2) → row 0; 6 (s4) → row 1 (2 left); 5 (s0) → row 2
    # (3 left); 3 (s1) → row 2, the tightest; 2 (s3) → row 1. 3 filled rows → one micro-batch
    # of 8 rows, the filled rows in place.
    placement = wide.place([5, 3, 8, 2, 6])
    assert placement.rows == 8 and placement.micro_batches == 1
    np.testing.assert_array_equal(placement.row_S, [2, 2, 0, 1, 1])
    with pytest.raises(ValueError, match=r"micro_rows \(6\) must be a multiple of row_shards"):
        RowLayout(row_len=8, packing=True, micro_rows=6, max_sequences=8, row_shards=4)


def test_shared_prompt_layout_right_aligns_prompts_and_tables_each_micro_batch():
    # 6 sequences (prompt + response tokens), prompt ids 7 7 9 7 9 8, rows of 10 slots, prompts
    # ending at slot 4 (P = 5), micro-batches of 4 rows: 6 rows -> M = 2, rows 8.
    layout = RowLayout(
        row_len=10, packing=False, micro_rows=4, max_sequences=8, prompt_slots=5, prompt_groups=3
    )
    assert layout.shared_prompts == (5, 3)
    lengths, prompts = [7, 5, 8, 6, 4, 9], [3, 2, 3, 3, 2, 5]
    placement = layout.place(lengths, prompts)
    np.testing.assert_array_equal(placement.offset_S, [2, 3, 2, 2, 3, 0])  # 5 - prompt length
    _check_placement(placement, lengths, layout)
    # Sequence j sits in global row (j % 4) * 2 + j // 4: rows 0 2 4 6 1 3.
    np.testing.assert_array_equal(placement.row_S, [0, 2, 4, 6, 1, 3])
    table, source = placement.prompt_tables(np.array([7, 7, 9, 7, 9, 8]), groups=3)
    # Micro-batch 0 = rows 0 2 4 6 (sequences 0 1 2 3: ids 7 7 9 7): prompts 7 (its row 0), 9
    # (its row 2). Micro-batch 1 = rows 1 3 5 7 (sequences 4 5, then two empty rows: ids 9 8).
    np.testing.assert_array_equal(table[0::2], [0, 2, 0, 0])
    np.testing.assert_array_equal(source[0::2], [0, 0, 1, 0])
    np.testing.assert_array_equal(table[1::2], [0, 1, 0, 0])
    np.testing.assert_array_equal(source[1::2], [0, 1, 0, 0])
    with pytest.raises(ValueError, match="3 distinct prompts, more than the 2"):
        placement.prompt_tables(np.array([7, 8, 9, 7, 9, 8]), groups=2)


def test_shared_prompt_layout_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="no packing"):
        RowLayout(10, True, 4, 8, prompt_slots=5, prompt_groups=2)
    with pytest.raises(ValueError, match="prompt_groups must be in 1..4"):
        RowLayout(10, False, 4, 8, prompt_slots=5, prompt_groups=5)
    with pytest.raises(ValueError, match="prompt_slots must be in 1..9"):
        RowLayout(10, False, 4, 8, prompt_slots=10, prompt_groups=2)
    layout = RowLayout(10, False, 4, 8, prompt_slots=5, prompt_groups=2)
    with pytest.raises(ValueError, match="need the prompt lengths"):
        layout.place([6, 7])
    with pytest.raises(ValueError, match="sequence 1 \\(6 prompt tokens of 8\\)"):
        layout.place([6, 8], [3, 6])  # a prompt longer than the prompt slots
    with pytest.raises(ValueError, match="sequence 0 \\(2 prompt tokens of 9\\)"):
        layout.place([9, 8], [2, 3])  # a response past the row's end
