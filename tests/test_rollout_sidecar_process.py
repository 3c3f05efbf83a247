"""Sidecar process supervision: config errors, a sidecar that never gets healthy, no orphans.

The orphan tests run a small "trainer" in a child process (the trainer venv's python), let it
die in different ways, and check the sidecar it started is gone soon after.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hf_fixtures import make_tiny_hf_checkpoint

from dynamo_jax.rollout import sidecar_client
from dynamo_jax.rollout.protocol import SamplingParams
from dynamo_jax.rollout.sidecar_client import (
    SidecarConfig,
    SidecarError,
    SidecarStartError,
    SidecarUnavailable,
    VLLMSidecarEngine,
)

REPO = Path(__file__).resolve().parents[1]
_SAMPLING = SamplingParams(max_new_tokens=4)
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
needs_vllm = pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(),
    reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("ckpt"), "qwen3")


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("max_restarts", -1, "SidecarConfig.max_restarts"),
        ("call_timeout_s", 0, "SidecarConfig.call_timeout_s"),
        ("restart_window_s", 0, "SidecarConfig.restart_window_s"),
        ("tensor_parallel", 0, "SidecarConfig.tensor_parallel"),
        ("sleep_level", 3, "SidecarConfig.sleep_level"),
        ("gpu_memory_utilization", 1.5, "SidecarConfig.gpu_memory_utilization"),
        ("dtype", "auto", "SidecarConfig.dtype"),
        ("python", "/nonexistent/python", "rollout.sidecar_python"),
        ("model_path", "/nonexistent", "init.checkpoint: no config.json"),
        ("shm_dir", "/nonexistent", "SidecarConfig.shm_dir"),
    ],
)
def test_config_errors_name_the_field(ckpt, field, value, match):
    kwargs = dict(python=sys.executable, model_path=str(ckpt))
    with pytest.raises(ValueError, match=match):
        SidecarConfig(**{**kwargs, field: value})


class FlakyProcess:
    """Stands in for a started sidecar: each call fails while `failures` is > 0."""

    failures = 0
    spawned = 0

    def __init__(self):
        FlakyProcess.spawned += 1
        self.popen = type("Popen", (), {"pid": 1000 + FlakyProcess.spawned})()

    def call(self, message, timeout_s):
        if FlakyProcess.failures:
            FlakyProcess.failures -= 1
            raise SidecarUnavailable("connection lost (sidecar exited with code -9)")
        return {"ok": True, "weight_version": 0, "results": []}

    def kill(self):
        pass


def test_restarts_are_counted_per_time_window(ckpt, tmp_path, monkeypatch):
    """max_restarts=2 per 100 s: two faults 10 s apart are ridden out, two more 2 minutes later
    too (the first two have left the window), a third within 100 s of those ends the run."""
    now = [0.0]
    monkeypatch.setattr(sidecar_client, "_monotonic", lambda: now[0])
    monkeypatch.setattr(sidecar_client, "spawn", lambda *args: FlakyProcess())
    monkeypatch.setattr(sidecar_client, "wait_healthy", lambda process, timeout_s: {})
    config = SidecarConfig(
        python=sys.executable, model_path=str(ckpt), max_restarts=2, restart_window_s=100.0
    )
    engine = VLLMSidecarEngine(config, None, tmp_path, label="sidecar 3")
    for t in (0.0, 10.0, 120.0, 125.0):
        now[0], FlakyProcess.failures = t, 1
        assert engine.generate([], _SAMPLING) == []  # restarted and retried
    assert engine.restarts == 4 and FlakyProcess.spawned == 5
    now[0], FlakyProcess.failures = 130.0, 1
    with pytest.raises(SidecarError, match=r"sidecar 3 failed .* after 2 restarts within 100 s"):
        engine.generate([], _SAMPLING)
    engine._res.process = None  # nothing real to shut down


@pytest.mark.vllm
@needs_vllm
def test_never_healthy_is_a_clear_error_naming_the_log(ckpt, tmp_path):
    config = SidecarConfig(
        python=VLLM_PYTHON, model_path=str(ckpt), dtype="float32", startup_timeout_s=3.0
    )
    with pytest.raises(SidecarStartError, match=r"not healthy after 3\.0 s") as err:
        VLLMSidecarEngine(config, model_cfg=None, workdir=tmp_path)
    log_path = tmp_path / "vllm_sidecar.log"
    assert str(log_path) in str(err.value)
    pid = int(re.search(r"\[sidecar (\d+) ", log_path.read_text()).group(1))
    assert not alive(pid)  # killed, not left loading vLLM in the background


def test_sidecar_that_dies_at_start_reports_exit_code_and_log(ckpt, tmp_path):
    # A stand-in interpreter that fails at once: what is tested is the client's report.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ImportError: no module named vllm_demo_failure'\nexit 3\n")
    fake.chmod(0o755)
    config = SidecarConfig(python=str(fake), model_path=str(ckpt), startup_timeout_s=60)
    with pytest.raises(SidecarStartError, match="exited with code 3") as err:
        VLLMSidecarEngine(config, model_cfg=None, workdir=tmp_path / "work")
    assert str(tmp_path / "work" / "vllm_sidecar.log") in str(err.value)
    assert "vllm_demo_failure" in str(err.value)  # the log's tail carries the cause


TRAINER = """
import os, signal, sys
from dynamo_jax.rollout import sidecar_client as sc
config = sc.SidecarConfig(python={python!r}, model_path={model!r}, dtype="float32",
                          max_model_len=128, enforce_eager=True, max_num_seqs=4)
how = sys.argv[1]
if how == "sigkill":  # die with no Python cleanup at all, while the sidecar is still starting
    proc = sc.spawn(config, {workdir!r} + "/vllm_sidecar.log", {workdir!r} + "/sock")
    print(proc.popen.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
engine = sc.VLLMSidecarEngine(config, model_cfg=None, workdir={workdir!r})
print(engine.pid, flush=True)
raise SystemExit(0)  # exit without close(): the finalizer must clean up
"""


def run_trainer(tmp_path: Path, ckpt: Path, how: str) -> int:
    script = TRAINER.format(python=VLLM_PYTHON, model=str(ckpt), workdir=str(tmp_path))
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), how],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.stdout.strip(), f"trainer printed no pid; stderr:\n{child.stderr[-3000:]}"
    return int(child.stdout.split()[0])


@pytest.mark.vllm
@needs_vllm
def test_trainer_killed_with_sigkill_leaves_no_sidecar(ckpt, tmp_path):
    pid = run_trainer(tmp_path, ckpt, "sigkill")
    assert wait_dead(pid, timeout_s=15), f"sidecar {pid} outlived its SIGKILLed trainer"
    assert "trainer closed its pipe" in (tmp_path / "vllm_sidecar.log").read_text()


@pytest.mark.vllm
@needs_vllm
def test_trainer_exiting_without_close_leaves_no_sidecar(ckpt, tmp_path):
    pid = run_trainer(tmp_path, ckpt, "exit")
    assert wait_dead(pid, timeout_s=15), f"sidecar {pid} outlived its trainer"
