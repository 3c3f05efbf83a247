"""Shape buckets, request expansion and left padding of the embedded rollout engine."""

import numpy as np
import pytest

from dynamo_jax.rollout import buckets
from dynamo_jax.rollout.protocol import Request


@pytest.mark.parametrize(
    "n,minimum,multiple,want",
    [(1, 8, 1, 8), (8, 8, 1, 8), (9, 8, 1, 16), (100, 16, 1, 128), (3, 2, 6, 6), (5, 1, 4, 8)],
)
def test_pow2_bucket(n, minimum, multiple, want):
    assert buckets.pow2_bucket(n, minimum, multiple) == want


def test_pow2_bucket_bounds_the_number_of_sizes():
    sizes = {buckets.pow2_bucket(n, 16) for n in range(1, 4097)}
    assert sizes == {16, 32, 64, 128, 256, 512, 1024, 2048, 4096}
    with pytest.raises(ValueError, match="positive"):
        buckets.pow2_bucket(0, 8)


def test_expand_requests_is_canonical_and_independent_of_request_order():
    reqs = [
        Request(7, (1, 2, 3), 2),
        Request(3, (4,), 1),
        Request(5, (9, 9, 9), 0),
        Request(4, (8, 8, 8), 1),
    ]
    rows = buckets.expand_requests(reqs, vocab_size=16)
    assert [(r.prompt_id, r.sample_index) for r in rows] == [(3, 0), (4, 0), (7, 0), (7, 1)]
    assert [r.request_index for r in rows] == [1, 3, 0, 0]
    again = buckets.expand_requests(list(reversed(reqs)), vocab_size=16)
    assert [(r.prompt_id, r.sample_index, r.prompt) for r in again] == [
        (r.prompt_id, r.sample_index, r.prompt) for r in rows
    ]


def test_expand_requests_rejects_duplicates_and_out_of_vocab_tokens():
    with pytest.raises(
        ValueError, match=r"requests\[1\] repeats prompt_id 3 \(also requests\[0\]\)"
    ):
        buckets.expand_requests([Request(3, (1,), 1), Request(3, (2,), 1)], vocab_size=16)
    with pytest.raises(ValueError, match=r"requests\[0\] \(prompt_id 2\).*\[16, -1\]"):
        buckets.expand_requests([Request(2, (1, 16, -1), 1)], vocab_size=16)


def test_split_rows_keeps_order_and_limits_size():
    rows = list(range(10))
    assert buckets.split_rows(rows, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_left_pad_right_aligns_prompts_and_gives_fillers_one_real_token():
    tokens, mask = buckets.left_pad([(5, 6), (7,)], batch=3, length=4)
    np.testing.assert_array_equal(tokens, [[0, 0, 5, 6], [0, 0, 0, 7], [0, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1]])
    with pytest.raises(ValueError, match="exceeds its bucket"):
        buckets.left_pad([(1, 2, 3)], batch=1, length=2)
