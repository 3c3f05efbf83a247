"""The stop request: the first signal asks, the second stops at once even where its own
KeyboardInterrupt is swallowed (a handler run inside a callback called from C)."""

import signal

import pytest

from dynamo_jax.stop import StopRequest


def test_the_first_signal_asks_and_the_second_raises():
    stop = StopRequest()
    stop(signal.SIGTERM, None)
    assert stop.requested and stop.signal_name == "SIGTERM" and not stop.aborted
    stop.raise_if_aborted()  # one signal: the loop goes on to its checkpoint
    with pytest.raises(KeyboardInterrupt):
        stop(signal.SIGINT, None)


def test_a_second_signal_swallowed_where_it_was_raised_still_stops_the_loop():
    stop = StopRequest()
    stop(signal.SIGINT, None)
    try:  # what CPython does with an exception raised in a gc callback: print and drop it
        stop(signal.SIGINT, None)
    except KeyboardInterrupt:
        pass
    with pytest.raises(KeyboardInterrupt):
        stop.raise_if_aborted()
