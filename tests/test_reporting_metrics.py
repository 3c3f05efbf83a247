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
