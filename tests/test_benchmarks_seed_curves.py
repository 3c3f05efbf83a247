"""benchmarks/seed_curves.py: every seed's evaluation numbers, the rise and the wall time."""

import json
from pathlib import Path

import pytest

from benchmarks import seed_curves


def _run(tmp_path: Path, name: str, evals: dict[int, float], step_s: float) -> Path:
    d = tmp_path / name
    d.mkdir()
    lines = []
    for step in range(0, 11):
        rec = {"step": step}
        if step:
            rec["time/step"] = step_s
        if step in evals:
            rec["eval/overall/pass@1"] = evals[step]
            rec["time/eval"] = 30.0
        lines.append(json.dumps(rec))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_table_has_every_seed_with_its_rise_and_minutes(tmp_path):
    a = _run(tmp_path, "s0", {0: 0.1, 5: 0.2, 10: 0.34}, step_s=6.0)
    b = _run(tmp_path, "s1", {0: 0.05, 5: 0.3, 10: 0.25}, step_s=12.0)
    text = seed_curves.table({"grpo": [a, b]}, "eval/overall/pass@1")
    rows = text.splitlines()
    assert rows[0] == "| method | run | step 0 | step 5 | step 10 | rise | AUC | minutes |"
    # 10 steps x 6 s + 3 evaluations x 30 s = 150 s = 2.5 min; 10 x 12 + 90 = 210 s = 3.5 min
    # AUC: (5 (0.1 + 0.2) / 2 + 5 (0.2 + 0.34) / 2) / 10 = 0.210; (0.875 + 1.375) / 10 = 0.225
    assert rows[2] == "| grpo | s0 | 0.100 | 0.200 | 0.340 | +0.240 | 0.210 | 2.5 |"
    assert rows[3] == "| grpo | s1 | 0.050 | 0.300 | 0.250 | +0.200 | 0.225 | 3.5 |"


def test_area_under_is_the_trapezoids_over_the_span():
    assert seed_curves.area_under({0: 0.0, 10: 1.0}) == pytest.approx(0.5)
    # uneven spacing: (2 (0 + 1) / 2 + 8 (1 + 1) / 2) / 10 = 0.9
    assert seed_curves.area_under({0: 0.0, 2: 1.0, 10: 1.0}) == pytest.approx(0.9)
    assert seed_curves.area_under({5: 0.4}) == pytest.approx(0.4)


def _alloc_run(tmp_path: Path, name: str, steps: list[dict]) -> Path:
    d = tmp_path / name
    d.mkdir()
    lines = [{"step": 0, "eval/overall/pass@1": 0.1}]
    lines += [{"step": i + 1, **s} for i, s in enumerate(steps)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return d


def test_allocation_table_sums_histograms_and_reads_moved_share(tmp_path):
    # GRPO: 4 prompts x 8 every step; DynaMO: n = (2, 6, 8, 16) then uniform
    uniform = {"alloc/n_hist": [0] * 8 + [4], "alloc/n_min": 8, "alloc/n_max": 8}
    grpo = _alloc_run(
        tmp_path,
        "grpo_s0",
        [
            {**uniform, "reward/zero_var_groups": 0.5, "reward/prompt_mean": 0.2},
            {**uniform, "reward/zero_var_groups": 0.25, "reward/prompt_mean": 0.4},
        ],
    )
    skewed = [0] * 17
    skewed[2] = skewed[6] = skewed[8] = skewed[16] = 1
    dynamo = _alloc_run(
        tmp_path,
        "dynamo_s0",
        [
            # no alloc/moved_share logged: computed from the histogram,
            # n̄ = 8: (16 - 8) / 32 = 0.25
            {
                "alloc/n_hist": skewed,
                "alloc/n_min": 2,
                "alloc/n_max": 16,
                "reward/zero_var_groups": 0.0,
                "reward/prompt_mean": 0.6,
            },
            {
                **uniform,
                "alloc/moved_share": 0.0,
                "reward/zero_var_groups": 0.75,
                "reward/prompt_mean": 0.8,
            },
        ],
    )
    out = tmp_path / "curves.png"
    seed_curves.main([f"grpo={grpo}", f"dynamo={dynamo}", "--alloc", "--out", str(out)])
    assert (tmp_path / "curves_alloc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = seed_curves.allocation_table({"grpo": [grpo], "dynamo": [dynamo]}).splitlines()
    assert rows[2] == ("| grpo | grpo_s0 | 2 | 0.000 | 0.000 | 0.375 | 8–8 | 8×8 | 0.300 | 0.300 |")
    assert rows[3] == (
        "| dynamo | dynamo_s0 | 2 | 0.125 | 0.250 | 0.375 | 2–16 "
        "| 2×1 6×1 8×5 16×1 | 0.700 | 0.700 |"
    )


def test_train_curve_is_a_trailing_mean_of_the_pool_accuracy(tmp_path):
    steps = [{"reward/prompt_mean": v, "alloc/n_hist": [0, 1]} for v in (0.0, 0.3, 0.6, 0.9)]
    d = _alloc_run(tmp_path, "s0", steps)
    curve = seed_curves.train_curve(seed_curves._records(d), window=2)
    assert curve == pytest.approx({1: 0.0, 2: 0.15, 3: 0.45, 4: 0.75})


def test_plot_is_written_and_bad_spec_is_refused(tmp_path):
    a = _run(tmp_path, "s0", {0: 0.1, 10: 0.3}, step_s=1.0)
    out = tmp_path / "curves.png"
    seed_curves.main([f"grpo={a}", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="LABEL=DIR"):
        seed_curves.parse_groups(["no_equals_sign"])
    with pytest.raises(SystemExit, match="missing or empty"):
        seed_curves.table({"grpo": [tmp_path / "absent"]}, "eval/overall/pass@1")


def test_keys_tabulate_a_training_metric_at_every_step(tmp_path, capsys):
    a = _run(tmp_path, "s0", {0: 0.1, 10: 0.3}, step_s=1.0)
    lines = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec["step"]:
            rec["rollout/engine_logp_abs_diff"] = rec["step"] / 100
    (a / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    seed_curves.main([f"bf16={a}", "--keys", "rollout/engine_logp_abs_diff"])
    out = capsys.readouterr().out
    table = out.split("(`rollout/engine_logp_abs_diff`)")[1].strip().splitlines()
    assert table[0].startswith("| method | run | step 1 | step 2 |")
    assert table[2].startswith("| bf16 | s0 | 0.010 | 0.020 | 0.030 |")
    seed_curves.main(
        [f"bf16={a}", "--keys", "rollout/engine_logp_abs_diff", "--keys_format", ".1e"]
    )
    out = capsys.readouterr().out
    table = out.split("(`rollout/engine_logp_abs_diff`)")[1].strip().splitlines()
    assert table[2].startswith("| bf16 | s0 | 1.0e-02 | 2.0e-02 | 3.0e-02 |")
