"""Unicode and spelling normalisation before any check (rewards/normalise.py)."""

import pytest

from dynamo_jax.rewards.normalise import normalise


@pytest.mark.parametrize(
    "text, expected",
    [
        ("12", "12"),
        ("１２", "12"),  # fullwidth digits (NFKC)
        ("٣", "3"),  # another script's decimal digit
        ("x²", "x^{2}"),  # not NFKC's x2
        ("10¹²", "10^{12}"),
        ("−3", "-3"),
        ("‒3", "-3"),
        ("12–13", "12 to 13"),  # a range between numbers reads as two values
        ("12 — 13", "12 to 13"),
        ("½", "1/2"),
        ("12 ± 1", "12  \\pm  1"),
        ("a ∨ b", "a  \\lor  b"),
        ("2 × 3", "2  \\times  3"),
        ("√2", "\\sqrt 2"),
        ("90°", "90^\\circ "),
        ("\\$18.90", "18.90"),
        ("$2.50", "2.50"),
        (" \\$ 54.60", "  54.60"),
        ("$x$ and $3$", "$x$ and $3$"),  # math delimiters stay
        ("1\\,000", "1000"),
        ("1{,}000", "1000"),
        ("32,\\!348", "32,348"),
        ("1\\,5", "1\\,5"),  # not a digit group
        ("x\\,dx", "x\\,dx"),
    ],
)
def test_normalise(text, expected):
    assert normalise(text) == expected


def test_ascii_text_is_returned_as_is():
    text = "So \\boxed{\\frac{1}{2}} and $x = 3$."
    assert normalise(text) is text
