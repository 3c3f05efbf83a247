"""The run directory before training: input files, the resume rule on saved configs, start over,
and the lock that keeps a second run off a workdir."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from configs import tiny
from dynamo_jax import workdir as run_dir
from dynamo_jax.config import from_config_dict, to_json_dict
from dynamo_jax.errors import CheckpointError, ConfigError, ExitCode, WorkdirInUseError


def _cfg(**overrides):
    config = tiny.get_config()
    for dotted, value in overrides.items():
        section, field = dotted.split("__")
        config[section][field] = value
    return from_config_dict(config)


def _saved(cfg):
    return json.loads(json.dumps(to_json_dict(cfg)))  # as the checkpoint's meta holds it


# ----------------------------------------------------------------------------- the rule


def test_model_shape_blocks_a_resume_and_steps_only_warn():
    saved = _saved(_cfg())
    blocking, other = run_dir.config_differences(
        saved, to_json_dict(_cfg(model__num_layers=3, train__steps=200, eval__every_steps=7))
    )
    assert blocking == ["model.num_layers 2 → 3"]
    assert other == ["eval.every_steps 50 → 7", "train.steps 100 → 200"]


@pytest.mark.parametrize(
    "override,blocks",
    [
        ({"model__num_layers": 3}, True),
        ({"model__param_dtype": "bfloat16"}, True),
        ({"model__dtype": "bfloat16"}, False),  # compute dtype: same parameters
        ({"model__remat_policy": "full"}, False),
        ({"data__seed": 1}, True),  # the data order the saved iterator position counts in
        ({"data__synthetic_op": "mixed"}, True),
        ({"data__system_prompt": "x"}, False),
        ({"train__prompts_per_step": 8, "train__mini_batch_size": 32}, True),
        ({"allocation__policy": "uniform"}, True),
        ({"allocation__g_max": 12}, False),
        ({"optim__learning_rate": 5e-4}, False),
        ({"train__seed": 7}, False),
        ({"mesh__shape": (1, 1, -1)}, False),
        ({"checkpoint__every_steps": 5}, False),
        ({"logging__tensorboard": False}, False),
    ],
)
def test_which_differences_block(override, blocks):
    blocking, other = run_dir.config_differences(_saved(_cfg()), to_json_dict(_cfg(**override)))
    assert bool(blocking) == blocks, (blocking, other)
    assert blocking or other  # a difference is never dropped


def test_a_field_the_saved_config_lacks_counts_as_its_default():
    defaults = _cfg(model__scan_layers=True, model__remat_policy="none")  # ModelConfig's own
    saved = _saved(defaults)
    del saved["model"]["remat_policy"], saved["model"]["scan_layers"]  # added to the code later
    blocking, other = run_dir.config_differences(saved, to_json_dict(defaults))
    assert blocking == other == []
    # configs/tiny.py unrolls its layers: a checkpoint from before the field existed was scanned.
    blocking, _ = run_dir.config_differences(saved, to_json_dict(_cfg()))
    assert blocking == ["model.scan_layers true → false"]


def test_check_fits_names_the_field_and_the_way_out(tmp_path):
    meta = {"config": _saved(_cfg())}
    run_dir.check_fits(tmp_path, _cfg(train__steps=300), 10, meta)  # only a warning
    with pytest.raises(CheckpointError) as err:
        run_dir.check_fits(tmp_path, _cfg(model__num_layers=3), 10, meta)
    first, second = str(err.value).splitlines()
    assert first == (
        f"{tmp_path}: its checkpoint (step 10) was saved with a config this run cannot continue: "
        "model.num_layers 2 → 3"
    )
    assert "--start_over" in second and f"{tmp_path}/config.json" in second


# ----------------------------------------------------------------------------- inputs


def test_missing_input_files_name_the_field(tmp_path):
    config = tiny.get_config()
    config.data.paths = (str(tmp_path / "train.parquet"),)
    with pytest.raises(ConfigError, match=r"config\.data\.paths\[0\]: no such file: .*train"):
        run_dir.check_inputs(from_config_dict(config))
    config = tiny.get_config()
    config.init.checkpoint = str(tmp_path)
    with pytest.raises(ConfigError, match="config.init.checkpoint: .* has no config.json"):
        run_dir.check_inputs(from_config_dict(config))
    config.init.checkpoint = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match="config.init.checkpoint: no such directory"):
        run_dir.check_inputs(from_config_dict(config))
    run_dir.check_inputs(_cfg())  # the synthetic task names no file


# ----------------------------------------------------------------------------- start over


def test_start_over_moves_the_previous_run_and_deletes_nothing(tmp_path):
    assert run_dir.move_previous_run(tmp_path) is None  # nothing to move
    for name in ("metrics.jsonl", "config.json", "notes.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    first = run_dir.move_previous_run(tmp_path)
    assert first == tmp_path / "previous-1"
    assert sorted(p.name for p in first.iterdir()) == [
        "checkpoints",
        "config.json",
        "metrics.jsonl",
    ]
    assert (tmp_path / "notes.txt").read_text() == "notes.txt"  # not a run output: left alone
    (tmp_path / "metrics.jsonl").write_text("second")
    assert run_dir.move_previous_run(tmp_path) == tmp_path / "previous-2"
    assert (tmp_path / "previous-2" / "metrics.jsonl").read_text() == "second"
    assert (first / "metrics.jsonl").read_text() == "metrics.jsonl"


# ----------------------------------------------------------------------------- the lock

_HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from dynamo_jax import workdir\n"
    "workdir.lock_workdir(Path(sys.argv[1]))\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
)


def _holder(tmp_path):
    """A process that takes `tmp_path`'s lock and keeps it (until it is killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_a_locked_workdir_is_refused_naming_the_holder(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(WorkdirInUseError) as err:
            run_dir.lock_workdir(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert f"pid {holder.pid} on host {socket.gethostname()}, started 20" in message
    assert f"lock {tmp_path / run_dir.LOCK}" in message
    assert err.value.exit_code == ExitCode.REFUSED


def test_a_lock_left_by_kill_9_never_blocks_a_rerun(tmp_path):
    holder = _holder(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert json.loads((tmp_path / run_dir.LOCK).read_text())["pid"] == holder.pid  # file stays
    lock = run_dir.lock_workdir(tmp_path)  # ... its lock does not
    assert json.loads((tmp_path / run_dir.LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    lock.release()  # idempotent
    run_dir.lock_workdir(tmp_path).release()  # released: the next run takes it


def test_prepare_holds_the_lock_and_releases_it_when_it_refuses(tmp_path, monkeypatch):
    cfg = _cfg()
    (tmp_path / "metrics.jsonl").write_text("")
    lock = run_dir.prepare(tmp_path, cfg, start_over=False)
    with pytest.raises(WorkdirInUseError):
        run_dir.prepare(tmp_path, cfg, start_over=True)
    assert (tmp_path / "metrics.jsonl").exists()  # the locked run's outputs were not moved
    lock.release()

    def refuse(workdir, cfg):
        raise CheckpointError("a checkpoint this config cannot continue")

    monkeypatch.setattr(run_dir, "check_resumable", refuse)  # refused after the lock was taken
    with pytest.raises(CheckpointError, match="cannot continue"):
        run_dir.prepare(tmp_path, cfg, start_over=False)
    run_dir.lock_workdir(tmp_path).release()  # ... and left unlocked


def _wait_for_event(timeline: Path, event: str, index: int, proc, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = timeline.read_text().splitlines() if timeline.exists() else []
        if any((e["event"], e["index"]) == (event, index) for e in map(json.loads, lines)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    pytest.fail(f"no {event} {index} within {timeout} s")


@pytest.mark.slow
def test_a_second_launch_on_a_running_workdir_exits_2_and_the_first_is_unchanged(tmp_path):
    """Issue 47's two writers: the second launch on a running workdir exits 2 at once with one
    line naming the first's pid and host; the first finishes bit-identical to a run alone."""
    from helpers.scripts import launch
    from helpers.train_runs import (
        LAUNCH_ARGS,
        ROOT,
        _assert_same_tree,
        _deterministic,
        _final_state,
        _short_config,
    )

    from dynamo_jax.reporting.metrics import read_metrics

    args = (*LAUNCH_ARGS, "--config.train.steps=6", "--config.checkpoint.every_steps=2")  # fmt: skip
    alone = launch(*args, f"--workdir={tmp_path / 'alone'}")
    assert alone.returncode == 0, alone.stderr[-3000:]

    shared, timeline = tmp_path / "shared", tmp_path / "timeline.jsonl"
    worker = [sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(timeline), "none"]
    first = subprocess.Popen(
        [*worker, *args, f"--workdir={shared}"], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_for_event(timeline, "save_end", 2, first)  # mid-run, a checkpoint written
        # Held there (the lock stays held) so that the second launch, whose imports take
        # longer than the first's remaining steps, meets it mid-run.
        os.kill(first.pid, signal.SIGSTOP)
        began = time.monotonic()
        try:
            second = launch(*args, f"--workdir={shared}", timeout=300)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        refused_after = time.monotonic() - began
        out, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == ExitCode.REFUSED, second.stderr[-3000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --workdir {shared} is in use"), lines
    assert f"pid {first.pid} on host {socket.gethostname()}" in lines[0]
    assert refused_after < 60, refused_after  # before anything is built
    assert first.returncode == 0, out[-3000:]
    assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == ["4", "6"]  # no damage
    assert _deterministic(read_metrics(shared)) == _deterministic(read_metrics(tmp_path / "alone"))
    config = _short_config(method="e3", steps=6, every=2)
    step, params, restored = _final_state(shared, config)
    step_alone, params_alone, restored_alone = _final_state(tmp_path / "alone", config)
    assert step == step_alone == 6
    _assert_same_tree(params, params_alone)
    _assert_same_tree(restored.device, restored_alone.device)
    print(f"second launch refused after {refused_after:.1f} s")


# ----------------------------------------------------------------------------- lost workdirs

QUIET = (
    "--config.logging.progress_bar=False",
    "--config.logging.tensorboard=False",
    "--config.logging.plots_at_end=False",
    "--config.eval.every_steps=0",
)


def test_a_read_only_workdir_is_refused_in_one_line(tmp_path):
    """A real read-only filesystem (a tmpfs remounted ro; root can write through chmod)."""
    from helpers.scripts import launch
    from helpers.small_fs import small_fs

    with small_fs(tmp_path / "fs", "1m") as fs:
        (fs / "w").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        proc = launch(
            f"--config={Path(tiny.__file__)}:method=grpo", f"--workdir={fs / 'w'}", *QUIET
        )
    assert proc.returncode == ExitCode.REFUSED, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"error: --workdir {fs / 'w'}: not a usable directory (Read-only file system)"]


def test_check_still_there_notices_a_workdir_deleted_or_replaced(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    started_in = run_dir.identity(workdir)
    assert run_dir.check_still_there(workdir, started_in) is None
    # Moved away, the original directory lives on elsewhere and keeps its inode, so the one made
    # in its place next is certainly another (after an rmdir the filesystem may hand the freed
    # inode straight back, and a replacement would look like the original).
    workdir.rename(tmp_path / "moved")
    assert "disappeared while the run was using it" in run_dir.check_still_there(
        workdir, started_in
    )
    workdir.mkdir()
    assert "was replaced by another directory" in run_dir.check_still_there(workdir, started_in)
    workdir.rmdir()
    assert "disappeared while the run was using it" in run_dir.check_still_there(
        workdir, started_in
    )


@pytest.mark.slow
def test_a_workdir_vanished_mid_run_stops_it_in_one_line_within_a_step(tmp_path):
    from helpers.train_runs import LAUNCH_ARGS, ROOT

    workdir, timeline = tmp_path / "w", tmp_path / "timeline.jsonl"
    worker = [sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(timeline), "none"]
    proc = subprocess.Popen(
        [*worker, *LAUNCH_ARGS, "--config.train.steps=8", "--config.checkpoint.every_steps=2",
         f"--workdir={workdir}"],
        cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_for_event(timeline, "save_end", 2, proc)
        workdir.rename(tmp_path / "elsewhere")  # the path disappears (files open stay valid)
        gone_at = time.time()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    events = [json.loads(line) for line in timeline.read_text().splitlines()]
    noticed = [e for e in events if e["event"] == "step_begin" and e["t"] > gone_at]
    assert proc.returncode == ExitCode.FAILED, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    # "replaced" when a writer of the run (an async save's directory) recreated the path after
    # the rename and before the check's stat: both say the run no longer has its directory.
    assert len(lines) == 1, err
    assert re.search(r"(disappeared|was replaced by another directory) while the run", lines[0])
    assert len(noticed) <= 1  # it stopped before the first step after the deletion trained
    print(f"noticed {time.time() - gone_at:.1f} s after the deletion (process exit)")
