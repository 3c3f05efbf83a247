"""The stop request: the first signal asks, the second stops at once even where its own
KeyboardInterrupt is swallowed (a handler run inside a callback called from C)."""

import signal
import sys

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


class _RaisesWhenCollected:
    def __init__(self, exc):
        self.exc = exc

    def __del__(self):
        raise self.exc


def test_a_swallowed_second_signal_prints_no_traceback_and_other_errors_still_reach_the_hook():
    """CPython hands an exception raised in a finaliser or a gc callback to sys.unraisablehook,
    which prints a traceback; the second signal's own KeyboardInterrupt is silenced there, and
    nothing else is."""
    seen = []
    before = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: seen.append(unraisable.exc_type)
    stop = StopRequest()
    previous = stop.install()
    try:
        assert previous, "pytest runs this test on the main thread"
        _RaisesWhenCollected(KeyboardInterrupt())  # before the second signal: not ours
        stop(signal.SIGINT, None)
        stop.aborted = True  # the second signal, its raise swallowed where it landed
        _RaisesWhenCollected(KeyboardInterrupt())
        _RaisesWhenCollected(ValueError("a finaliser's own bug"))
    finally:
        stop.restore(previous)
    try:
        assert seen == [KeyboardInterrupt, ValueError]
        assert signal.getsignal(signal.SIGINT) is previous[signal.SIGINT]
        assert sys.unraisablehook is not stop._unraisablehook
    finally:
        sys.unraisablehook = before
