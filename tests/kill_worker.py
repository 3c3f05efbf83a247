"""`launch.py` with a recorded timeline and a planned SIGKILL: the child of the kill -9 harness
(test_loop_train.py::test_kill_9_at_random_moments_then_resume_is_bit_identical).

    python tests/kill_worker.py TIMELINE KILL LAUNCH_ARGS...
    KILL_WORKER_RAISE=SidecarError:2 python tests/kill_worker.py ...   (a fault, not a kill)
    KILL_WORKER_FILL=6:PATH python tests/kill_worker.py ...   (another writer fills the disk)

Appends one JSON line per event to TIMELINE: {"event", "index", "t"} for step_begin/step_end
(index = the step), save_begin/save_end (index = the checkpoint step; end = committed),
committed (orbax committed the step and has not yet deleted the steps beyond max_to_keep) and
closed (the checkpointer closed after the last save). KILL is "none" or "EVENT:INDEX:DELAY":
SIGKILL this process DELAY seconds after that event, from a timer thread, whatever it is doing
then (compiling, mid-step, writing a checkpoint), or at the end of that phase (step_end,
save_end) if it ends first, so every planned kill lands inside its phase. `install` records
the timeline inside a test process too (the uninterrupted reference run). KILL_WORKER_FILL
writes the file PATH until its filesystem is full just after the free-space check of the save of
that step passed, so the save itself runs out of space (the disk-full tests).
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's dynamo_jax, launch.py and configs


def install(timeline: Path, kill: str, patch=None) -> None:
    """Wrap train.rl_step and Checkpointer.save/close to record events (and arm the kill).

    `patch(obj, name, value)` sets the wrappers (pytest's monkeypatch.setattr in a test)."""
    from dynamo_jax.checkpoint import Checkpointer
    from dynamo_jax.loop import train

    patch = patch or setattr
    planned = None if kill == "none" else kill.rsplit(":", 2)
    out = open(timeline, "a")  # noqa: SIM115 (open for the life of the process)

    ends = {"step_begin": "step_end", "save_begin": "save_end"}

    def event(name: str, index: int) -> None:
        out.write(json.dumps({"event": name, "index": index, "t": time.time()}) + "\n")
        out.flush()
        if planned and ends.get(planned[0]) == name and int(planned[1]) == index:
            os.kill(os.getpid(), signal.SIGKILL)  # the phase ended before the timer fired
        if planned and planned[0] == name and int(planned[1]) == index:
            delay = float(planned[2])
            if delay <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
            timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()

    real_step, real_save, real_close = train.rl_step, Checkpointer.save, Checkpointer.close

    fault = os.environ.get("KILL_WORKER_RAISE", "")

    def rl_step(tr, step):
        event("step_begin", step)
        if fault and int(fault.split(":")[1]) == step:
            from dynamo_jax.errors import SidecarError

            kind = {"RuntimeError": RuntimeError, "SidecarError": SidecarError}[fault.split(":")[0]]
            raise kind(f"injected at step {step}: sidecar 0 failed after 3 restarts")
        metrics = real_step(tr, step)
        event("step_end", step)
        return metrics

    def save(self, step, **kwargs):
        event("save_begin", step)
        real_save(self, step, **kwargs)
        event("save_end", step)

    def close(self):
        real_close(self)
        if not self.read_only:
            event("closed", 0)

    import orbax.checkpoint as ocp

    real_finalize = ocp.CheckpointManager._finalize_checkpoint

    def finalize_checkpoint(self, step):
        out = real_finalize(self, step)
        event("committed", step)  # orbax deletes the steps beyond max_to_keep right after
        return out

    fill = os.environ.get("KILL_WORKER_FILL", "")
    real_check_space = Checkpointer.check_space

    def check_space(self, step, device, host):
        real_check_space(self, step, device, host)
        if fill and int(fill.split(":", 1)[0]) == step:
            _fill(Path(fill.split(":", 1)[1]))

    patch(Checkpointer, "check_space", check_space)
    patch(train, "rl_step", rl_step)
    patch(Checkpointer, "save", save)
    patch(Checkpointer, "close", close)
    patch(ocp.CheckpointManager, "_finalize_checkpoint", finalize_checkpoint)


def _fill(path: Path) -> None:
    """Write `path` until its filesystem has no room left (ENOSPC), keeping what was written."""
    import errno

    with open(path, "ab", buffering=0) as f:
        block = b"\0" * 65536
        while True:
            try:
                f.write(block)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    return
                block = block[: len(block) // 2]


def main() -> None:
    timeline, kill, *launch_args = sys.argv[1:]
    install(Path(timeline), kill)
    from absl import app

    import launch
    from dynamo_jax import cli

    app.run(launch.main, argv=[str(ROOT / "launch.py"), *launch_args], flags_parser=cli.parse_flags)


if __name__ == "__main__":
    main()
