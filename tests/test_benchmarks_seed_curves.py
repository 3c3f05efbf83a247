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
    a = _run(tmp_path, "s0", {0: 0.1, 5: 0.2, 10: 0.35}, step_s=6.0)
    b = _run(tmp_path, "s1", {0: 0.05, 5: 0.3, 10: 0.25}, step_s=12.0)
    text = seed_curves.table({"grpo": [a, b]}, "eval/overall/pass@1")
    rows = text.splitlines()
    assert rows[0] == "| method | run | step 0 | step 5 | step 10 | rise | minutes |"
    # 10 steps x 6 s + 3 evaluations x 30 s = 150 s = 2.5 min; 10 x 12 + 90 = 210 s = 3.5 min
    assert rows[2] == "| grpo | s0 | 0.100 | 0.200 | 0.350 | +0.250 | 2.5 |"
    assert rows[3] == "| grpo | s1 | 0.050 | 0.300 | 0.250 | +0.200 | 3.5 |"


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
