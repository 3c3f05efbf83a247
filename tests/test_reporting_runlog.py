"""runlog.library_detail_to: library records and abandoned objects' errors go to the run's log
file; a full garbage collection ends only the blocks that need one."""

import contextlib
import gc
import logging

import pytest

from dynamo_jax.reporting import runlog


@contextlib.contextmanager
def _full_collections():
    """The number of full (generation 2) collections started within the block, with the
    automatic collector off so that only explicit ones count."""
    started = []

    def callback(phase, info):
        if phase == "start" and info["generation"] == 2:
            started.append(1)

    was_enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(callback)
    try:
        yield started
    finally:
        gc.callbacks.remove(callback)
        if was_enabled:
            gc.enable()


class _Abandoned:
    """An object in a reference cycle whose finaliser raises, as orbax's abandoned reading
    coroutines do when they are collected."""

    def __init__(self):
        self.cycle = self

    def __del__(self):
        raise RuntimeError("abandoned read")


def test_a_block_that_ends_well_does_no_full_collection(tmp_path):
    with _full_collections() as started:
        with runlog.library_detail_to(tmp_path / "run.log"):
            logging.getLogger("orbax.checkpoint").error("a library's record")
    assert started == []
    assert "a library's record" in (tmp_path / "run.log").read_text()


def test_collect_or_a_raising_block_collects_and_the_abandoned_error_reaches_the_file(tmp_path):
    log_file = tmp_path / "run.log"
    with _full_collections() as started:
        with runlog.library_detail_to(log_file, collect=True):
            _Abandoned()
        assert len(started) == 1
        with pytest.raises(ValueError, match="the read failed"):
            with runlog.library_detail_to(log_file):
                _Abandoned()
                raise ValueError("the read failed")
        assert len(started) == 2
    text = log_file.read_text()
    assert text.count("exception ignored in") == 2 and "RuntimeError: abandoned read" in text
