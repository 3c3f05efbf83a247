"""benchmarks/generation_speed.py counts what the engines generate, not timings.

Oracles: greedy decoding is deterministic, so every engine must produce the same completions
and hence the same token counts; the expected length of a completion under a stop id is
computed here from the same completion generated without that stop (first occurrence + 1).
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import generation_speed as gs
from configs import smollm2_arith

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
NEW = smollm2_arith.get_config().rollout.max_new_tokens  # the benchmark keeps the config's


def test_produced_counts_up_to_and_including_the_first_stop():
    assert gs.produced([5, 6, 2, 2, 2], (2,)) == 3  # padding after the stop is not counted
    assert gs.produced([2, 7], (2,)) == 1
    assert gs.produced([5, 6, 7], (2,)) == 3  # no stop: all of it
    assert gs.produced([5, 9, 6, 2], (2, 9)) == 2  # any of several stop ids
    assert gs.produced([], (2,)) == 0


def test_cpu_seconds_include_a_live_child_process():
    burn = "import time\nwhile time.process_time() < 0.5: pass\nprint('done', flush=True)\ninput()"
    before = gs.cpu_seconds()
    child = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "done\n"  # it has used >= 0.5 CPU s and is alive
        assert gs.cpu_seconds() - before >= 0.4  # /proc counts whole clock ticks
    finally:
        child.communicate("\n", timeout=60)


def _check_rounds(report, engines, rounds):
    assert [r["engine"] for r in report["rounds"]] == list(engines) * rounds  # interleaved
    for r in report["rounds"]:
        assert r["rows"] == len(r["lengths"]) == 8 * 8
        assert r["tokens"] == sum(r["lengths"])
        assert all(1 <= n <= NEW for n in r["lengths"])
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"])
        assert r["cpu_seconds"] >= 0
        assert r["tokens_per_cpu_s"] == pytest.approx(r["tokens"] / max(r["cpu_seconds"], 0.01))
    for name in engines:
        mine = [r for r in report["rounds"] if r["engine"] == name]
        stats = report["engines"][name]
        assert stats["tokens"] == [r["tokens"] for r in mine]
        assert stats["median_tokens_per_s"] == statistics.median(r["tokens_per_s"] for r in mine)
        assert stats["median_tokens_per_cpu_s"] == statistics.median(
            r["tokens_per_cpu_s"] for r in mine
        )
        assert stats["vs_jax"] == pytest.approx(
            stats["median_tokens_per_s"] / report["engines"]["jax"]["median_tokens_per_s"]
        )
        assert stats["first_batch_s"] >= stats["build_s"] > 0


def test_tiny_greedy_run_embedded_and_hf_count_the_same_tokens(tmp_path):
    out = tmp_path / "report.json"
    args = gs.parse_args(
        ["--model", "tiny", "--engines", "jax,hf", "--threads", "0", "--rounds", "2",
         "--temperature", "0", "--profile", "--json", str(out)]
    )  # fmt: skip
    report = gs.run(args)
    assert json.loads(out.read_text())["engines"].keys() == {"jax", "hf"}
    _check_rounds(report, ("jax", "hf"), 2)
    for jax_round, hf_round in zip(report["rounds"][::2], report["rounds"][1::2]):
        assert jax_round["lengths"] == hf_round["lengths"]  # the same greedy completions
    prof = report["jax_profile"]
    assert prof["tokens"] == report["rounds"][0]["tokens"]  # greedy: every round the same
    assert prof["programs"]["prefill"]["calls"] == 1  # 64 rows fit one batch (max_batch 128)
    assert prof["tokens"] <= prof["row_steps"]


def test_tiny_sampled_rows_stop_at_the_stop_token_or_the_limit(tmp_path):
    args = gs.parse_args(
        ["--model", "tiny", "--engines", "jax,hf", "--threads", "0", "--rounds", "1"]
    )
    report = gs.run(args)
    _check_rounds(report, ("jax", "hf"), 1)
    for r in report["rounds"]:  # a short row has stopped; one may also stop at the limit
        assert sum(n < NEW for n in r["lengths"]) <= r["stopped"] <= r["rows"]


def test_a_stop_token_ends_the_count_in_both_engines(tmp_path):
    """Greedy completions without a stop, then with a token they emit mid-way as the stop id:
    every engine's completion must end at that token's first occurrence."""
    args = gs.parse_args(["--model", "tiny", "--threads", "0", "--temperature", "0"])
    work = gs.build_workload(args, tmp_path)
    free = dataclasses.replace(work, stop_ids=(-1,))  # an id no token has: nothing stops
    hf = gs.HFEngine(free)
    rows = hf.round(0)
    assert all(len(r) == NEW for r in rows)
    stop = rows[0][5]
    expected = [r.index(stop) + 1 if stop in r else NEW for r in rows]
    assert expected[0] <= 6  # not vacuous: the stop shortens at least the first prompt's rows
    stopping = dataclasses.replace(work, stop_ids=(stop,))
    for engine in (gs.HFEngine(stopping), gs.build("jax", stopping, tmp_path, "")):
        try:
            result = gs.timed_round(engine, 1, stopping.stop_ids)
        finally:
            engine.close()
        assert result["lengths"] == expected, engine.name
        assert result["stopped"] == sum(n < NEW or rows[i][NEW - 1] == stop
                                        for i, n in enumerate(expected))  # fmt: skip


@pytest.mark.vllm
@pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(),
    reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
)
def test_tiny_greedy_run_all_three_engines_from_the_command_line(tmp_path):
    out = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "benchmarks.generation_speed", "--model", "tiny",
        "--threads", "1", "--rounds", "1", "--temperature", "0", "--json", str(out),
        "--vllm-python", VLLM_PYTHON,
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["cores"] == report["cores"][:1] and report["torch_threads"] == 1
    _check_rounds(report, ("jax", "vllm", "hf"), 1)
    lengths = [r["lengths"] for r in report["rounds"]]
    assert lengths[0] == lengths[1] == lengths[2]  # the same greedy completions everywhere
    assert "| vllm |" in proc.stdout and "[load " in proc.stdout
