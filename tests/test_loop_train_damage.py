"""The kill/damage harness, extended: every kind of checkpoint damage on the newest step of a
finished run, then a rerun of the same command; and a SIGKILL between a save and orbax's
pruning. For each kind: the damage is detected (the step is moved aside, nothing blocks), nothing
is lost (what was damaged is kept for inspection, the run resumes from the previous step and
ends bit-identical to the undamaged run)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.damage import KINDS, _within
from helpers.train_runs import LAUNCH_ARGS, ROOT, _assert_same_tree, _deterministic, _final_state

from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer
from dynamo_jax.config import from_config_dict
from dynamo_jax.loop import train
from dynamo_jax.reporting.metrics import read_metrics
from dynamo_jax.reporting.summary import Status


def _data_file(step):
    d = step / "params" / "ocdbt.process_0" / "d"
    return max(d.iterdir(), key=lambda f: f.stat().st_size)


def _replace(kind, where):
    def damage(step):
        target = where(step)
        target.unlink()
        KINDS[kind](target)
        return target.relative_to(step)

    return damage


def _step_as_file(step):
    shutil.rmtree(step)
    step.write_text("notes that happen to bear the step's name\n")
    return Path()


def _renamed_copy(step):
    shutil.rmtree(step)
    shutil.copytree(step.parent / "3", step)  # a complete copy of step 3 named 6
    return Path("meta")


def _flip(step):
    f = _data_file(step)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    return f.relative_to(step)


def _no_meta(step):
    shutil.rmtree(step / "meta")
    return Path("params")


DAMAGE = {
    "fifo in the parameters' data file": _replace("fifo", _data_file),
    "fifo in the meta JSON": _replace("fifo", lambda s: s / "meta" / "metadata"),
    "fifo in orbax's step metadata": _replace("fifo", lambda s: s / "_CHECKPOINT_METADATA"),
    "socket in an item's metadata": _replace("socket", lambda s: s / "params" / "_METADATA"),
    "device in the parameters' data file": _replace("device", _data_file),
    "directory in the meta JSON's place": _replace("directory", lambda s: s / "meta" / "metadata"),
    "dangling link in the parameters' data file": _replace("dangling link", _data_file),
    "step directory replaced by a file": _step_as_file,
    "copy of step 3 renamed to 6": _renamed_copy,
    "flipped bit in the parameters": _flip,
    "meta item removed": _no_meta,
}


@pytest.mark.slow
def test_every_kind_of_damage_is_detected_and_nothing_is_lost(finished_run, tmp_path, capsys):
    config, original = finished_run
    want_metrics = _deterministic(read_metrics(original))
    want_params = _final_state(original, config)[1]
    detected, lost = [], []
    for i, (name, damage) in enumerate(DAMAGE.items()):
        workdir = Path(shutil.copytree(original, tmp_path / f"w{i}"))
        kept = damage(workdir / "checkpoints" / "6")
        fifo = workdir / "checkpoints" / "6" / kept
        fifo = fifo if os.path.exists(fifo) and not fifo.is_dir() else None
        summary = _within(300, lambda w=workdir: train.run(from_config_dict(config), w), fifo)
        aside = workdir / "checkpoints" / "6.damaged-1"
        if summary.start_step == 3 and os.path.lexists(aside):
            detected.append(name)
        intact = (
            os.path.lexists(aside / kept)
            and summary.status is Status.FINISHED
            and summary.last_step == 6
            and _deterministic(read_metrics(workdir)) == want_metrics
        )
        if intact:
            try:
                _assert_same_tree(_final_state(workdir, config)[1], want_params)
            except AssertionError:
                intact = False
        if not intact:
            lost.append(name)
    with capsys.disabled():
        print(f"\ndamage kinds tried {len(DAMAGE)}, detected {len(detected)}, lost {len(lost)}")
    assert detected == list(DAMAGE) and lost == []


@pytest.mark.slow
def test_a_kill_between_a_save_and_its_pruning_leaves_the_bound_restored(tmp_path):
    """SIGKILL right after orbax committed the final step 6 and before it deleted step 2
    (max_to_keep = 2, saves at 2, 4, 6): three steps are left; the rerun, with nothing left to
    save, deletes the oldest and ends with the bound."""
    workdir = tmp_path / "w"
    args = [*LAUNCH_ARGS, f"--workdir={workdir}", "--config.train.steps=6",
            "--config.checkpoint.every_steps=2"]  # fmt: skip
    timeline = tmp_path / "t.jsonl"
    cmd = [sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(timeline), "committed:6:0"]
    proc = subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-3000:]
    last = json.loads(timeline.read_text().splitlines()[-1])
    assert (last["event"], last["index"]) == ("committed", 6)
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(), read_only=True)
    assert ckpt.all_steps() == [2, 4, 6]  # one beyond the bound
    ckpt.close()
    rerun = [sys.executable, str(ROOT / "launch.py"), *args]
    proc = subprocess.run(rerun, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "had already finished at step 6" in proc.stdout
    assert "deleted checkpoint step(s) 2" in proc.stderr
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(), read_only=True)
    assert ckpt.all_steps() == [4, 6]
    ckpt.close()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4", "6"]
