"""A full disk is one line (exit 6), loses nothing, and the resume after space is freed equals an
uninterrupted run: on a real small filesystem (a tmpfs; skipped where it cannot be mounted), the
save that runs out of space while orbax writes (another writer filled the disk after the
free-space check) and the free-space check that refuses a save before anything is written."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.scripts import launch
from helpers.small_fs import fill, small_fs
from helpers.train_runs import (
    LAUNCH_ARGS,
    ROOT,
    _assert_same_tree,
    _deterministic,
    _final_state,
    _short_config,
)

from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer
from dynamo_jax.errors import ExitCode
from dynamo_jax.reporting.metrics import read_metrics

ARGS = (*LAUNCH_ARGS, "--config.train.steps=6", "--config.checkpoint.every_steps=2",
        "--config.checkpoint.max_to_keep=3")  # fmt: skip
# One simulated device: no "mesh uses 1 of 8 devices" warning among the lines counted.
ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _config():
    config = _short_config(method="e3", steps=6, every=2)
    config.checkpoint.max_to_keep = 3
    return config


def _one_error_line(proc) -> str:
    everything = proc.stdout + proc.stderr
    assert "Traceback" not in everything and "Exception ignored" not in everything, everything
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _steps(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_full_disk_is_one_line_loses_nothing_and_the_resume_is_exact(tmp_path):
    alone = launch(*ARGS, f"--workdir={tmp_path / 'alone'}", env=ENV)
    assert alone.returncode == 0, alone.stderr[-3000:]

    with small_fs(tmp_path / "fs", "16m") as fs:
        workdir = fs / "w"
        # The save of step 6 runs out of space mid-write: another writer fills the disk just
        # after that save's free-space check passed.
        timeline = tmp_path / "timeline.jsonl"
        worker = [sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(timeline), "none"]
        full = subprocess.run(
            [*worker, *ARGS, f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True,
            env={**ENV, "KILL_WORKER_FILL": f"6:{fs / 'filler'}"}, timeout=600,
        )  # fmt: skip
        assert full.returncode == ExitCode.NO_SPACE, full.stderr[-3000:]
        line = _one_error_line(full)
        assert line.startswith("error: checkpoint step 6 not written: no space left on device")
        assert "6.orbax-checkpoint-tmp" in line and "was removed" in line, line
        assert "step 4 is intact" in line and "rerun the same command" in line, line
        assert _steps(workdir) == ["2", "4"]  # the partial step removed, nothing else touched
        # (orbax's detail goes to run.log where there is room: on this full disk there is none)

        # Still full: the rerun refuses at once, before a step is trained or a file written.
        again = launch(*ARGS, f"--workdir={workdir}", env=ENV)
        assert again.returncode == ExitCode.NO_SPACE, again.stderr[-3000:]
        line = _one_error_line(again)
        assert "checkpoint step 6 not written: it needs about 1." in line, line
        assert "step 4 is intact" in line, line
        assert _steps(workdir) == ["2", "4"]

        # Space freed: the rerun resumes from step 4 and ends as the uninterrupted run did.
        (fs / "filler").unlink()
        resumed = launch(*ARGS, f"--workdir={workdir}", env=ENV)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resumed {workdir} from step 4" in resumed.stdout
        config = _config()
        step, params, restored = _final_state(workdir, config)
        step_alone, params_alone, restored_alone = _final_state(tmp_path / "alone", config)
        assert step == step_alone == 6
        _assert_same_tree(params, params_alone)
        _assert_same_tree(restored.device, restored_alone.device)
        assert _deterministic(read_metrics(workdir)) == _deterministic(
            read_metrics(tmp_path / "alone")
        )


def test_a_save_that_cannot_fit_writes_nothing_and_one_that_runs_out_leaves_no_partial(tmp_path):
    """In process, on a 3 MB tmpfs: the free-space check refuses before writing; a save that
    runs out anyway (the disk filled after the check) removes orbax's partial step."""
    import jax.numpy as jnp

    from dynamo_jax.errors import DiskFullError

    with small_fs(tmp_path / "fs", "3m") as fs:
        ckpt = Checkpointer(fs / "checkpoints", CheckpointConfig(max_to_keep=2))
        params = {"w": jnp.arange(200_000, dtype=jnp.float32)}  # 0.8 MB
        opt_state = {"m": jnp.zeros(4)}
        device = {"params": params, "opt_state": opt_state, "progress": {"step": jnp.int32(0)}}
        ckpt.save(1, device=device, host={"x": np.zeros(3)}, meta={})
        ckpt.wait()
        fill(fs / "filler", leave=500_000)
        with pytest.raises(DiskFullError, match=r"checkpoint step 2 not written: it needs about"):
            ckpt.save(2, device=device, host={"x": np.zeros(3)}, meta={})
        assert sorted(p.name for p in ckpt.directory.iterdir()) == ["1"]
        (fs / "filler").unlink()
        fill(fs / "filler", leave=1_200_000)  # room for the check (one step), not for the write
        ckpt.check_space = lambda *a: None  # the check passed before another writer filled it
        fill_after = fs / "filler2"
        real_save = ckpt._manager.save

        def save_after_filling(*args, **kwargs):
            fill(fill_after, leave=100_000)
            return real_save(*args, **kwargs)

        ckpt._manager.save = save_after_filling
        with pytest.raises(DiskFullError) as err:
            ckpt.save(2, device=device, host={"x": np.zeros(3)}, meta={})
        assert "checkpoint step 2 not written: no space left on device" in str(err.value)
        assert "2.orbax-checkpoint-tmp" in str(err.value)
        assert sorted(p.name for p in ckpt.directory.iterdir()) == ["1"]
        ckpt.close()  # what orbax left raises nothing more
        reader = Checkpointer(fs / "checkpoints", CheckpointConfig(), read_only=True)
        assert reader.all_steps() == [1]
        reader.close()
