"""Checkpoint damage that reading would hang on or that orbax would delete: a pipe, socket,
device or directory in a file's place, a step name that is a file, a step copied to another
number; and `max_to_keep` restored after a kill between a save and its pruning."""

import logging
import os

import numpy as np
import pytest
from helpers.checkpoint_items import _items, _save, _tree_equal
from helpers.damage import KINDS, _within

from dynamo_jax.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    DamagedStepError,
    abstract_like,
    find_unsafe,
)

# Where a file of step 2 is replaced: the parameters' array data, an item's metadata, the
# meta item's JSON and orbax's step metadata (read when the directory is opened).
POSITIONS = {
    "params data": lambda step: max(
        (f for f in (step / "params" / "ocdbt.process_0" / "d").iterdir()),
        key=lambda f: f.stat().st_size,
    ),
    "params _METADATA": lambda step: step / "params" / "_METADATA",
    "meta JSON": lambda step: step / "meta" / "metadata",
    "step metadata": lambda step: step / "_CHECKPOINT_METADATA",
}


def _two_steps(directory):
    ckpt = Checkpointer(directory, CheckpointConfig(every_steps=1, max_to_keep=5))
    _save(ckpt, 1)
    _save(ckpt, 2)
    ckpt.close()


@pytest.mark.parametrize("position", sorted(POSITIONS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_non_file_in_a_files_place_is_damage_found_without_reading(
    tmp_path, kind, position, caplog
):
    _two_steps(tmp_path / "ck")
    target = POSITIONS[position](tmp_path / "ck" / "2")
    target.unlink()
    KINDS[kind](target)
    assert set(find_unsafe(tmp_path / "ck")) == {"2"}
    fifo = target if kind == "fifo" else None

    # A reader (export, evaluation) skips it and moves nothing.
    def read():
        reader = Checkpointer(tmp_path / "ck", CheckpointConfig(), read_only=True)
        try:
            return reader.all_steps(), reader.restore_latest(abstract_like(_items(0.0))).step
        finally:
            reader.close()

    assert _within(60, read, fifo) == ([1], 1)
    assert (tmp_path / "ck" / "2").is_dir()

    # A training run moves it aside before orbax opens the directory, with a message.
    def train():
        with caplog.at_level(logging.WARNING):
            ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(max_to_keep=5))
        try:
            return ckpt.restore_latest(abstract_like(_items(0.0)), move_damaged=True)
        finally:
            ckpt.close()

    got = _within(60, train, fifo)
    assert got.step == 1
    _tree_equal(got.device, _items(1.0))
    assert "step 2" in caplog.text and "moved aside to 2.damaged-1" in caplog.text
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["1", "2.damaged-1"]
    moved = tmp_path / "ck" / "2.damaged-1" / target.relative_to(tmp_path / "ck" / "2")
    assert os.path.lexists(moved)  # kept for inspection, nothing deleted


def test_a_step_name_that_is_a_file_is_moved_aside_never_deleted(tmp_path, caplog):
    _two_steps(tmp_path / "ck")
    import shutil

    shutil.rmtree(tmp_path / "ck" / "2")
    (tmp_path / "ck" / "2").write_text("my notes\n")
    with caplog.at_level(logging.WARNING):
        ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(max_to_keep=5))
    assert "step 2" in caplog.text and "it is a regular file, not a step directory" in caplog.text
    assert (tmp_path / "ck" / "2.damaged-1").read_text() == "my notes\n"
    assert ckpt.restore_latest(abstract_like(_items(0.0)), move_damaged=True).step == 1
    _save(ckpt, 2)  # the step is written anew beside the file
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2]
    assert (tmp_path / "ck" / "2.damaged-1").read_text() == "my notes\n"
    # A file that appears under the name of the step being saved is moved aside, not deleted.
    (tmp_path / "ck" / "3").write_text("more notes\n")
    with caplog.at_level(logging.WARNING):
        _save(ckpt, 3)
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2, 3]
    assert (tmp_path / "ck" / "3.damaged-1").read_text() == "more notes\n"
    ckpt.close()


def test_a_step_copied_to_another_number_is_damage(tmp_path, caplog):
    import shutil

    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=5))
    _save(ckpt, 1)
    _save(ckpt, 10)
    ckpt.wait()
    assert ckpt.read_meta(10)["step"] == 10  # recorded by save whatever meta the caller gave
    shutil.copytree(tmp_path / "ck" / "10", tmp_path / "ck" / "11")
    ckpt.close()
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(max_to_keep=5))
    assert ckpt.all_steps() == [1, 10, 11]
    with pytest.raises(DamagedStepError, match="it records step 10: a copy of another step"):
        ckpt.restore(11, abstract_like(_items(0.0)))
    with caplog.at_level(logging.WARNING):
        got = ckpt.restore_latest(abstract_like(_items(0.0)), move_damaged=True)
    assert got.step == 10 and "moved aside to 11.damaged-1" in caplog.text
    _tree_equal(got.device, _items(10.0))
    ckpt.close()


def test_prune_restores_max_to_keep_after_a_kill_between_save_and_pruning(tmp_path):
    """The state such a kill leaves: one step more than the bound; opening the directory with
    the bound and pruning (what a resumed run does) deletes the oldest, nothing else."""
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=4))
    for step in (1, 2, 3, 4):
        _save(ckpt, step)
    ckpt.close()
    (tmp_path / "ck" / "7").write_text("not ours\n")  # a file named like a step: moved aside
    ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(every_steps=1, max_to_keep=3))
    assert ckpt.all_steps() == [1, 2, 3, 4]
    assert ckpt.prune() == [1]
    assert ckpt.all_steps() == [2, 3, 4]
    assert ckpt.prune() == []
    _save(ckpt, 5)
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4, 5]
    ckpt.close()
    assert (tmp_path / "ck" / "7.damaged-1").read_text() == "not ours\n"
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["3", "4", "5", "7.damaged-1"]
    np.testing.assert_array_equal(
        Checkpointer(tmp_path / "ck", CheckpointConfig(), read_only=True).all_steps(), [3, 4, 5]
    )


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_library_detail_goes_to_the_log_file_not_the_console(tmp_path, caplog):
    """orbax logs errors (some with tracebacks) while it reads a damaged directory; with a log
    file they go there, and the console keeps the project's one line per damaged step."""
    _two_steps(tmp_path / "ck")
    (tmp_path / "ck" / "1" / "_CHECKPOINT_METADATA").write_text("garbage")  # orbax logs it
    data = POSITIONS["params data"](tmp_path / "ck" / "2")
    data.write_bytes(data.read_bytes()[:10])  # truncated: orbax's read fails
    log_file = tmp_path / "run.log"
    with caplog.at_level(logging.INFO):
        ckpt = Checkpointer(tmp_path / "ck", CheckpointConfig(max_to_keep=5), log_file=log_file)
        got = ckpt.restore_latest(abstract_like(_items(0.0)), move_damaged=True)
        ckpt.close()
    assert got.step == 1
    console = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in console] == ["dynamo_jax.checkpoint"], [r.getMessage() for r in console]
    [line] = [r.getMessage() for r in console]
    assert line.startswith(f"checkpoint step 2 in {tmp_path / 'ck'} is damaged (its ")
    assert line.endswith(
        f"moved aside to 2.damaged-1; trying the previous one (details: {log_file})"
    )
    assert "\n" not in line
    text = log_file.read_text()
    assert "Failed to json parse Metadata file" in text  # orbax's record, kept here
    assert "checkpoint step 2 is damaged" in text and "Traceback (most recent call last)" in text
    # orbax's abandoned reading coroutines ("Exception ignored in <coroutine ...>", the ~60
    # lines the console showed) reach the file, never pytest's (the console's) unraisable hook:
    # the filterwarnings mark turns one that escapes into a failure. (Whether one is left to
    # collect depends on what tensorstore cached from earlier tests, so it is not required.)
