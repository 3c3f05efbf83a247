"""Stage timings: a stopwatch around a block, and the stages' timings added up by name."""

import time

from dynamo_jax.loop.timings import Stopwatch, add_timings


def test_a_stopwatch_measures_its_block():
    with Stopwatch() as clock:
        time.sleep(0.05)
    assert 0.05 <= clock.seconds < 5.0
    assert Stopwatch().seconds == 0.0  # never started: nothing measured


def test_timings_of_the_same_name_add_up_and_the_parts_are_left_alone():
    generated = {"time/generate": 1.5, "time/generate_background": 0.25}
    rounds = {"time/generate": 2.0, "time/score": 0.5}
    scored = {"time/score": 0.125}
    total = add_timings(generated, scored, rounds, {})
    assert total == {
        "time/generate": 3.5,
        "time/generate_background": 0.25,
        "time/score": 0.625,
    }
    assert generated == {"time/generate": 1.5, "time/generate_background": 0.25}
    assert add_timings() == {}
