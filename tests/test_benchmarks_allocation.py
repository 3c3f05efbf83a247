"""benchmarks/allocation.py at sizes too small for one of its ratios: a column without a
baseline prints nan instead of stopping the script."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _allocation(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.allocation", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_a_run_shorter_than_an_epoch_has_no_after_epoch_ratio():
    # 256 prompts in batches of 64: an epoch is 4 steps, so 3 steps never reach epoch 2
    rows = [r.split() for r in _allocation("--prompts", "256", "--steps", "3", "--batch", "64")]
    uniform = next(r for r in rows if r[:1] == ["uniform"])
    assert uniform[1] == "1.000" and uniform[2] == "nan"


def test_a_run_past_its_first_epoch_has_the_after_epoch_ratio():
    rows = [r.split() for r in _allocation("--prompts", "256", "--steps", "6", "--batch", "64")]
    uniform = next(r for r in rows if r[:1] == ["uniform"])
    assert uniform[2] == "1.000"
