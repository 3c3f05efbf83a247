"""Metrics JSONL/TensorBoard writer, resume truncation, and the plots built from the JSONL."""

import numpy as np
import pytest

from dynamo_jax.reporting import plots
from dynamo_jax.reporting.metrics import (
    LoggingConfig,
    MetricsWriter,
    read_metrics,
    truncate_metrics,
)


def _write_run(workdir, steps=range(1, 11), **cfg):
    w = MetricsWriter(workdir, LoggingConfig(**cfg), total_steps=10, start_step=0)
    for s in steps:
        w.write(
            s,
            {
                "reward/mean": np.float32(s / 10),
                "entropy/mean": 1.0 / s,
                "temperature": np.float64(0.6 + 0.01 * s),
                "alloc/n_mean": 4.0,
                "alloc/n_min": np.int64(2),
                "alloc/n_max": 8,
                "alloc/n_hist": np.array([0, 0, 3, 0, 1]),
                "loss/bad": float("nan"),
            },
        )
    w.close()


def test_jsonl_records_are_json_scalars_and_nan_is_a_string(tmp_path):
    _write_run(tmp_path, progress_bar=False)
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == list(range(1, 11))
    assert recs[2]["reward/mean"] == pytest.approx(0.3)
    assert recs[0]["alloc/n_hist"] == [0, 0, 3, 0, 1]
    assert recs[0]["loss/bad"] == "nan"
    assert all(isinstance(r["alloc/n_min"], int) for r in recs)
    assert list((tmp_path / "tb").iterdir()), "TensorBoard event file expected"


def _tensorboard_scalars(logdir):
    """{tag: [(step, value)]} as TensorBoard itself reads the run's events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_tensorboard_reads_every_numeric_value_of_every_step(tmp_path):
    _write_run(tmp_path, progress_bar=False)
    scalars = _tensorboard_scalars(tmp_path / "tb")
    numeric = ["reward/mean", "entropy/mean", "temperature", "alloc/n_mean", "alloc/n_min",
               "alloc/n_max"]  # fmt: skip
    # The array and the non-finite value ("nan" in the JSONL) are in the JSONL only.
    assert sorted(scalars) == sorted(numeric)
    for record in read_metrics(tmp_path):
        step = record["step"]
        for tag in numeric:
            (value,) = [v for s, v in scalars[tag] if s == step]
            assert value == pytest.approx(np.float32(record[tag])), (tag, step)


def test_tensorboard_drops_the_steps_after_a_resumes_checkpoint(tmp_path):
    _write_run(tmp_path, progress_bar=False)  # steps 1-10, then a resume from step 6
    w = MetricsWriter(tmp_path, LoggingConfig(progress_bar=False), total_steps=10, start_step=6)
    for step in (7, 8):
        w.write(step, {"reward/mean": 100.0 + step})
    w.close()
    rewards = _tensorboard_scalars(tmp_path / "tb")["reward/mean"]
    assert rewards == [(s, pytest.approx(s / 10)) for s in range(1, 7)] + [(7, 107.0), (8, 108.0)]


def test_truncate_on_resume_and_torn_last_line(tmp_path):
    _write_run(tmp_path, progress_bar=False, tensorboard=False)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 11, "rew')  # a SIGKILL mid-write
    assert len(read_metrics(tmp_path)) == 10
    truncate_metrics(tmp_path, 6)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    # Appending after truncation continues the file.
    _write_run(tmp_path, steps=range(7, 9), progress_bar=False, tensorboard=False)
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 9))


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(tmp_path)


def test_plots_written_from_jsonl(tmp_path):
    _write_run(tmp_path, progress_bar=True, tensorboard=False)
    plots.main([str(tmp_path)])
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["allocation.png", "entropy.png", "reward.png", "temperature.png"]
    for name in names:
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_smoothing_is_a_trailing_mean():
    got = plots._smooth(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 2)
    np.testing.assert_allclose(got, [1.0, 1.5, 2.5, 3.5, 4.5])


# ----------------------------------------------------------------------------- faults

# The writer's file reaches the disk slowly from step 4 on: half of that record is written and
# flushed, then the process waits, so the SIGKILL lands mid-record every time (with a plain file a
# kill landed inside a write only by chance: in CI ten kills once never did).
_KILLED_WRITER = (
    "import sys, time\n"
    "from dynamo_jax.reporting.metrics import LoggingConfig, MetricsWriter\n"
    "w = MetricsWriter(sys.argv[1], LoggingConfig(tensorboard=False, progress_bar=False),\n"
    "                  total_steps=10, start_step=0)\n"
    "for step in (1, 2, 3):\n"
    "    w.write(step, {'blob': 'x' * 1000})\n"
    "real = w._file\n"
    "class SlowDisk:\n"
    "    def write(self, text):\n"
    "        real.write(text[: len(text) // 2]); real.flush()\n"
    "        print('torn', flush=True); time.sleep(600)\n"
    "    def __getattr__(self, name):\n"
    "        return getattr(real, name)\n"
    "w._file = SlowDisk()\n"
    "w.write(4, {'blob': 'x' * 1000})\n"
)


def test_a_record_torn_by_kill_9_is_dropped_at_the_resume(tmp_path):
    """A real SIGKILL of a process writing metrics.jsonl, in the middle of a record: the file
    ends in a torn line; `read_metrics` skips it and the resume's `truncate_metrics` leaves whole
    records only, after which the next run appends cleanly."""
    import signal
    import subprocess
    import sys

    workdir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(workdir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "torn\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    text = (workdir / "metrics.jsonl").read_bytes()
    assert text.count(b"\n") == 3 and not text.endswith(b"\n")  # three records and a torn one
    whole = text.count(b"\n")
    records = read_metrics(workdir)
    assert [r["step"] for r in records] == list(range(1, whole + 1))
    truncate_metrics(workdir, last_step=whole)  # what the resume does
    assert (workdir / "metrics.jsonl").read_bytes() == text[: text.rindex(b"\n") + 1]
    w = MetricsWriter(workdir, LoggingConfig(tensorboard=False, progress_bar=False),
                      total_steps=100, start_step=whole)  # fmt: skip
    w.write(whole + 1, {"r": 1.0})
    w.close()
    assert [r["step"] for r in read_metrics(workdir)] == list(range(1, whole + 2))


def test_a_full_disk_under_metrics_jsonl_is_one_disk_full_error(tmp_path):
    """A real full filesystem (tmpfs), then an injected ENOSPC where a real one cannot be
    placed (TensorBoard's flush: its events file fits in a page already allocated)."""

    from helpers.small_fs import fill, small_fs

    from dynamo_jax.errors import DiskFullError, ExitCode

    with small_fs(tmp_path / "fs", "1m") as fs:
        w = MetricsWriter(fs, LoggingConfig(tensorboard=False, progress_bar=False),
                          total_steps=10, start_step=0)  # fmt: skip
        w.write(1, {"r": 1.0})
        fill(fs / "filler")
        with pytest.raises(DiskFullError) as err:
            w.write(2, {"blob": "x" * 65536})
        w.close()  # what could not be flushed is dropped, nothing raised
    assert err.value.exit_code == ExitCode.NO_SPACE
    assert str(err.value) == (
        f"{fs / 'metrics.jsonl'}: step 2's record not written: no space left on device, "
        f"0.0 MB free in {fs}"
    )


def test_an_enospc_from_tensorboard_is_one_disk_full_error(tmp_path, monkeypatch):
    import errno

    from tensorboardX import record_writer

    from dynamo_jax.errors import DiskFullError

    w = MetricsWriter(tmp_path, LoggingConfig(tensorboard=True, progress_bar=False),
                      total_steps=10, start_step=0)  # fmt: skip
    w.write(1, {"r": 1.0})

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_writer.RecordWriter, "flush", full)
    with pytest.raises(DiskFullError, match=r"tb: step 2's TensorBoard events not written"):
        w.write(2, {"r": 0.5})
    w.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]  # the JSONL record was written


def test_tensorboard_is_written_without_importing_torch_and_torch_imports_after(tmp_path):
    """torch's import was most of a run start's tensorboardX import; the writer never logs a
    torch tensor, so it is kept out (metrics._summary_writer_class), and left importable."""
    from helpers.scripts import python_snippet

    code = (
        "import sys\n"
        "from dynamo_jax.reporting.metrics import LoggingConfig, MetricsWriter\n"
        f"w = MetricsWriter({str(tmp_path)!r}, LoggingConfig(tensorboard=True, progress_bar=False),"
        " total_steps=2, start_step=0)\n"
        "w.write(1, {'r': 1.0}); w.close()\n"
        "print('torch loaded:', 'torch' in sys.modules)\n"
        "import torch\n"
        "print('torch after:', torch.tensor([1.0]).item())\n"
    )
    out = python_snippet(code)
    assert "torch loaded: False" in out and "torch after: 1.0" in out
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
