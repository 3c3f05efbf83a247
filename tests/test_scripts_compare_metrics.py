"""scripts/compare_metrics.py: two metrics.jsonl files agree once the timing keys are dropped."""

import json
from pathlib import Path

from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
compare_metrics = load_script("scripts/compare_metrics.py")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_timing_keys_are_ignored_and_everything_else_compared(tmp_path, capsys):
    a = _write(tmp_path / "a", [{"step": 1, "loss/loss": 0.5, "time/step": 1.0, "perf/x": 3}])
    b = _write(tmp_path / "b", [{"step": 1, "loss/loss": 0.5, "time/step": 2.0, "perf/x": 4}])
    assert compare_metrics.main([str(a), str(b)]) == 0
    assert "identical: 1 lines, 2 keys" in capsys.readouterr().out
    # with no prefix ignored the timings differ
    assert compare_metrics.main([str(a), str(b), "--ignore"]) == 1
    out = capsys.readouterr().out
    assert "line 1: 'perf/x': 3 != 4" in out and "line 1: 'time/step': 1.0 != 2.0" in out


def test_a_changed_value_a_missing_key_and_a_missing_line_are_reported(tmp_path, capsys):
    a = _write(tmp_path / "a", [{"step": 1, "r": 0.1, "k": 1}, {"step": 2, "r": 0.2}])
    b = _write(tmp_path / "b", [{"step": 1, "r": 0.1000001, "j": 1}])
    assert compare_metrics.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "line count: 2 != 1" in out
    assert "line 1: 'r': 0.1 != 0.1000001" in out
    assert "line 1: 'k' only in the first file" in out
    assert "line 1: 'j' only in the second file" in out


def test_unreadable_input_exits_2_naming_the_line(tmp_path, capsys):
    a = _write(tmp_path / "a", [{"step": 1}])
    bad = tmp_path / "bad"
    bad.write_text('{"step": 1}\n{"step": \n')
    assert compare_metrics.main([str(a), str(bad)]) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    assert compare_metrics.main([str(a), str(tmp_path / "missing")]) == 2
