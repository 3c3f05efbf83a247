"""Every row of launch.py's exit-status table (dynamo_jax/errors.py `ExitCode`,
docs/exit_codes.md), each through a `launch.py` subprocess on the tiny config with 1-2 steps:

0 DONE, 1 FAILED (a bug with its traceback; a known failure while running in one line),
2 REFUSED (missing config file, oversized mesh, unusable workdir: one line, no traceback),
3 INTERRUPTED (SIGTERM, Ctrl-C: the step finishes, a checkpoint is saved, the rerun resumes),
4 NONFINITE, 5 ABORTED (a second signal: stopped at once, no traceback).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers.scripts import launch

from dynamo_jax.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.py")
QUIET = (
    "--config.logging.progress_bar=False",
    "--config.logging.tensorboard=False",
    "--config.logging.plots_at_end=False",
    "--config.eval.every_steps=0",
)


def _args(workdir, steps=1, method="grpo"):
    return [f"--config={TINY}:method={method}", f"--workdir={workdir}",
            f"--config.train.steps={steps}", *QUIET]  # fmt: skip


def _worker(timeline, args, **env):
    """kill_worker.py (a launch.py that records step/save events) as a Popen, no kill planned."""
    cmd = [sys.executable, str(ROOT / "tests" / "kill_worker.py"), str(timeline), "none", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env},
    )  # fmt: skip


def _wait_for(timeline, event, index, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(timeline).exists():
            for line in Path(timeline).read_text().splitlines():
                e = json.loads(line)
                if (e["event"], e["index"]) == (event, index):
                    return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail(f"no {event} {index} within {timeout} s")


def _steps(workdir):
    from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer

    ckpt = Checkpointer(Path(workdir) / "checkpoints", CheckpointConfig(), read_only=True)
    try:
        return ckpt.all_steps()
    finally:
        ckpt.close()


def test_the_table_is_the_documented_one():
    doc = (ROOT / "docs" / "exit_codes.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} | `{code.name}` |" in doc, code


# ----------------------------------------------------------------------------- 2 REFUSED


@pytest.mark.parametrize(
    "args, message",
    [
        (("--config", "configs/nope.py", "--config.train.steps=10"),
         "error: --config: no such file: configs/nope.py"),
        ((f"--config={TINY}", "--config.mesh.shape=(1,4,1)"),
         "error: config.mesh.shape: MeshConfig.shape {'data': 1, 'fsdp': 4, 'tensor': 1} needs "
         "4 devices but 1 are available; change the shape or use -1 for one axis"),
        ((f"--config={TINY}", "--workdir=/proc/dynamo_workdir"),
         "error: --workdir /proc/dynamo_workdir: not a usable directory (No such file or "
         "directory)"),
    ],
    ids=["missing config file", "oversized mesh", "workdir under /proc"],
)  # fmt: skip
def test_refused_before_anything_changed_is_one_line_and_2(tmp_path, args, message):
    if not any(a.startswith("--workdir") for a in args):
        args = (*args, f"--workdir={tmp_path / 'w'}")
    env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}  # one CPU device
    proc = launch(*args, env=env)
    assert proc.returncode == ExitCode.REFUSED, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------------------- 1 FAILED


@pytest.mark.parametrize(
    "fault, lines",
    [
        ("RuntimeError:1", None),  # a bug: its traceback
        (
            "SidecarError:1",
            ["error: step 1: injected at step 1: sidecar 0 failed after 3 restarts"],
        ),
    ],
    ids=["bug", "sidecar dead after its restarts"],
)
def test_a_failure_while_running_is_1(tmp_path, fault, lines):
    proc = _worker(tmp_path / "t.jsonl", _args(tmp_path / "w"), KILL_WORKER_RAISE=fault)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.FAILED, err[-3000:]
    assert "run tiny_grpo failed after step 0 of 1" in out
    if lines is None:
        assert "Traceback (most recent call last)" in err and "RuntimeError: injected" in err
    else:
        assert "Traceback" not in err
        assert [line for line in err.splitlines() if line.startswith("error")] == lines


# ----------------------------------------------------------------------------- 0, 3, 5


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_finishes_the_step_checkpoints_and_exits_3_then_the_rerun_resumes(
    tmp_path, signum
):
    workdir, name = tmp_path / "w", signal.Signals(signum).name
    proc = _worker(tmp_path / "t.jsonl", _args(workdir, steps=2))
    _wait_for(tmp_path / "t.jsonl", "step_begin", 1, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.INTERRUPTED, err[-3000:]
    assert "Traceback" not in err
    assert f"{name}: finishing the step in flight, then checkpointing and exiting" in out
    assert f"run tiny_grpo interrupted ({name}) after step 1 of 2; checkpointed" in out
    assert _steps(workdir) == [1]
    proc = launch(*_args(workdir, steps=2))
    assert proc.returncode == ExitCode.DONE, proc.stderr[-3000:]
    assert "finished at step 2 of 2 (resumed at step 1; this launch ran step 2)" in proc.stdout


@pytest.mark.slow
def test_a_second_signal_stops_at_once_with_5_and_no_traceback(tmp_path):
    workdir = tmp_path / "w"
    proc = _worker(tmp_path / "t.jsonl", _args(workdir, steps=2))
    _wait_for(tmp_path / "t.jsonl", "step_begin", 1, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.ABORTED, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "error: interrupted twice: stopped at once" in err
    assert _steps(workdir) == []  # the step in flight was not checkpointed


# ----------------------------------------------------------------------------- 4 NONFINITE


@pytest.mark.slow
def test_non_finite_updates_stop_the_run_with_4(tmp_path):
    """From an initial checkpoint of NaN weights every update is non-finite and skipped; the
    limit of 2 is reached at the second update of step 1, which ends the run."""
    from configs import tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.models.hf_io import save_hf_checkpoint
    from dynamo_jax.models.qwen import param_shapes

    cfg = from_config_dict(tiny.get_config("method=grpo"))
    nan = jax.tree.map(lambda s: np.full(s.shape, np.nan, s.dtype), param_shapes(cfg.model))
    save_hf_checkpoint(nan, cfg.model, tmp_path / "nan_init")
    proc = launch(*_args(tmp_path / "w", steps=4), f"--config.init.checkpoint={tmp_path / 'nan_init'}",
                   "--config.train.max_consecutive_nonfinite=2")  # fmt: skip
    assert proc.returncode == ExitCode.NONFINITE, proc.stderr[-3000:]
    assert "run tiny_grpo stopped: non-finite updates after step 1 of 4: 2 non-finite " in (
        proc.stdout
    )
    assert "checkpoint   none written" in proc.stdout
