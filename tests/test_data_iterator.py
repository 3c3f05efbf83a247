"""The epoch iterator: permutations per epoch, epoch-end signal, resume, per-host slices."""

import itertools

import numpy as np
import pytest

from dynamo_jax.data import EpochIterator


def _take(it, n):
    return list(itertools.islice(it, n))


def test_each_epoch_is_a_fresh_permutation_with_an_end_signal():
    it = EpochIterator(num_rows=10, batch_size=3, seed=7)
    batches = _take(it, 9)  # 3 batches per epoch (the 10th row is dropped per epoch)
    assert [b.epoch for b in batches] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [b.step_in_epoch for b in batches] == [0, 1, 2] * 3
    assert [b.epoch_end for b in batches] == [False, False, True] * 3
    epochs = [np.concatenate([b.indices for b in batches[i : i + 3]]) for i in (0, 3, 6)]
    for rows in epochs:
        assert len(set(rows.tolist())) == 9 and rows.min() >= 0 and rows.max() < 10
    assert not np.array_equal(epochs[0], epochs[1])
    assert np.array_equal(epochs[0], np.random.default_rng([7, 0]).permutation(10)[:9])


def test_same_seed_same_order_other_seed_other_order():
    a = [b.indices for b in _take(EpochIterator(50, 5, seed=1), 20)]
    b = [b.indices for b in _take(EpochIterator(50, 5, seed=1), 20)]
    c = [b.indices for b in _take(EpochIterator(50, 5, seed=2), 20)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("stop_after", [0, 4, 5, 13])
def test_resume_from_state_dict_continues_the_same_sequence(stop_after):
    reference = [b.indices for b in _take(EpochIterator(23, 4, seed=3), 30)]
    first = EpochIterator(23, 4, seed=3)
    _take(first, stop_after)
    state = first.state_dict()
    assert set(state) == {"epoch", "position", "seed"}
    resumed = EpochIterator(23, 4, seed=999)  # the seed comes from the checkpoint
    resumed.load_state_dict(state)
    rest = [b.indices for b in _take(resumed, 30 - stop_after)]
    assert all(np.array_equal(x, y) for x, y in zip(reference[stop_after:], rest))


def test_hosts_read_disjoint_slices_of_the_global_batch():
    single = _take(EpochIterator(40, 8, seed=5), 12)
    hosts = [
        _take(EpochIterator(40, 8, seed=5, process_index=p, process_count=4), 12) for p in range(4)
    ]
    for step, batch in enumerate(single):
        parts = [hosts[p][step].indices for p in range(4)]
        assert all(len(part) == 2 for part in parts)
        assert np.array_equal(np.concatenate(parts), batch.indices)
        assert all(hosts[p][step].epoch_end == batch.epoch_end for p in range(4))


def test_resume_on_a_different_host_count():
    one = EpochIterator(40, 8, seed=5)
    _take(one, 3)
    reference = next(one).indices
    one_state = EpochIterator(40, 8, seed=5)
    _take(one_state, 3)
    halves = []
    for p in range(2):
        host = EpochIterator(40, 8, seed=0, process_index=p, process_count=2)
        host.load_state_dict(one_state.state_dict())
        halves.append(next(host).indices)
    assert np.array_equal(np.concatenate(halves), reference)


def test_bad_arguments_and_states():
    with pytest.raises(ValueError, match="divisible by process_count"):
        EpochIterator(10, 3, 0, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="exceeds num_rows"):
        EpochIterator(3, 4, 0)
    with pytest.raises(ValueError, match="process_index"):
        EpochIterator(10, 2, 0, process_index=2, process_count=2)
    it = EpochIterator(10, 2, 0)
    with pytest.raises(ValueError, match="missing"):
        it.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="out of range"):
        it.load_state_dict({"epoch": 0, "position": 5, "seed": 0})
