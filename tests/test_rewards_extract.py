"""Final-answer extraction and the cheap bounds that run before any parser."""

import time

import pytest

from dynamo_jax.rewards.extract import last_boxed, matching_braces, max_nesting_depth


@pytest.mark.parametrize(
    "text, expected",
    [
        ("no box here", None),
        ("\\boxed{3}", "3"),
        ("a \\boxed{3} b \\boxed{4} c", "4"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{ 7 }", "7"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are literal, not structure
        ("\\boxed{4} then \\boxed{3", "4"),  # unclosed last box: previous closed one
        ("\\boxed{3", None),
        ("\\fbox{x}", "x"),
        ("$\\boxed 7$", "7"),
        ("\\boxed {5}", "5"),
        ("\\boxedx{5}", None),  # a different macro name
        ("\\boxed{}", ""),
        ("\\boxed{a}\\boxed{\\boxed{b}}", "b"),  # the last box opened wins
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_matching_braces_pairs_and_skips_unclosed():
    text = "{a{b}}{"
    assert matching_braces(text) == {0: 5, 2: 4}


def test_last_boxed_is_linear_on_many_unclosed_boxes():
    # A quadratic scan (re-matching braces from every box) would take minutes here.
    text = "\\boxed{" * 200_000 + "1"
    start = time.perf_counter()
    assert last_boxed(text) is None
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize(
    "text, depth",
    [
        ("", 0),
        ("x", 0),
        ("(a)", 1),
        ("{[(x)]}", 3),
        ("(1,2]", 1),
        ("))((", 2),
        ("(" * 10_000, 10_000),
    ],
)
def test_max_nesting_depth(text, depth):
    assert max_nesting_depth(text) == depth
