"""A sidecar's private temporary directory left by a SIGKILLed trainer is removed by the next
run of the same workdir, and nothing that is not ours ever is (rollout/tempdirs.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dynamo_jax.rollout import tempdirs
from dynamo_jax.rollout.sidecar_client import SidecarConfig, SidecarStartError, VLLMSidecarEngine


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _records(workdir):
    return sorted((Path(workdir) / tempdirs.REGISTRY).glob("*.json"))


def _rewrite(record_file, **changes):
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, **changes}))


def test_a_dead_owners_directory_is_removed_a_live_ones_kept(tmp_path):
    path = Path(tempdirs.make(tmp_path))
    (path / "tmp").mkdir()
    (path / "tmp" / "vllm_dist_x").write_bytes(b"x" * 1000)
    [record] = _records(tmp_path)
    assert json.loads(record.read_text())["pid"] == os.getpid()
    assert tempdirs.remove_stale(tmp_path) == []  # ours, alive
    assert path.is_dir()
    _rewrite(record, pid=_dead_pid())
    assert tempdirs.remove_stale(tmp_path) == [path]
    assert not path.exists() and _records(tmp_path) == []


def test_a_reused_pid_does_not_keep_a_dead_runs_directory(tmp_path):
    path = Path(tempdirs.make(tmp_path))
    [record] = _records(tmp_path)
    _rewrite(record, start_time="1")  # our pid, but another process's start time
    assert tempdirs.remove_stale(tmp_path) == [path]


@pytest.mark.parametrize("kind", ["other name", "other root", "link", "file"])
def test_nothing_that_is_not_ours_is_removed(tmp_path, kind):
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "data").write_text("keep me")
    path = Path(tempdirs.make(tmp_path / "w"))
    [record] = _records(tmp_path / "w")
    if kind == "other name":
        changes = {"path": str(elsewhere), "tmp_root": str(elsewhere.parent)}
    elif kind == "other root":  # the name fits, but it is not where it was made
        target = tmp_path / path.name
        target.mkdir()
        (target / "data").write_text("keep me")
        changes = {"path": str(target)}
        elsewhere = target
    elif kind == "link":  # the recorded path now points at something else
        path.rmdir()
        path.symlink_to(elsewhere)
        changes = {}
    else:
        path.rmdir()
        path.write_text("keep me")
        changes = {}
    _rewrite(record, pid=_dead_pid(), **changes)
    assert tempdirs.remove_stale(tmp_path / "w") == []
    assert (elsewhere / "data").read_text() == "keep me"
    assert os.path.lexists(path)
    assert _records(tmp_path / "w") == [record]  # kept: a person should look at it
    if kind in ("link", "file"):
        path.unlink()
    else:
        path.rmdir()


TRAINER = """
from dynamo_jax.rollout import sidecar_client as sc
config = sc.SidecarConfig(python={python!r}, model_path={model!r}, startup_timeout_s=600)
sc.VLLMSidecarEngine(config, model_cfg=None, workdir={workdir!r})  # never healthy: waits
"""


def test_sigkilled_trainers_directory_is_removed_by_the_next_run(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    # Stand-in sidecars: one that waits until the trainer's pipe closes, one that fails at once.
    waits, fails = tmp_path / "waits", tmp_path / "fails"
    waits.write_text("#!/bin/sh\nread secret\ncat > /dev/null\n")
    fails.write_text("#!/bin/sh\necho 'no vllm here'\nexit 3\n")
    for script in (waits, fails):
        script.chmod(0o755)
    workdir = tmp_path / "w"
    code = TRAINER.format(python=str(waits), model=str(model), workdir=str(workdir))
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)])
    deadline = time.monotonic() + 120
    while not _records(workdir) and time.monotonic() < deadline:
        assert trainer.poll() is None
        time.sleep(0.05)
    [record] = _records(workdir)
    left = Path(json.loads(record.read_text())["path"])
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert left.is_dir()  # SIGKILL ran no cleanup

    config = SidecarConfig(python=str(fails), model_path=str(model), startup_timeout_s=60)
    with pytest.raises(SidecarStartError, match="exited with code 3"):
        VLLMSidecarEngine(config, model_cfg=None, workdir=workdir)
    assert not left.exists()
    assert _records(workdir) == []  # and the failed engine removed its own
