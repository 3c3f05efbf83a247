"""benchmarks/harness.py: the timer's statistics and its block until ready, thread pinning before
JAX, and the source revision a table cites.

Oracles: a scripted clock, so every call's seconds are known exactly; a value whose
`block_until_ready` records when it was called; a throwaway git repository whose commit id git
itself reports; the environment a fresh interpreter sees.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]


class ScriptedClock:
    """perf_counter stand-in: each call returns the next of `readings`."""

    def __init__(self, readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def test_warm_up_is_left_out_and_median_min_max_are_of_the_timed_calls():
    calls = []
    # One warm-up call of 9 s, then timed calls of 3, 1, 2, 5 s (start, end pairs).
    clock = ScriptedClock([0, 9, 10, 13, 20, 21, 30, 32, 40, 45])
    timing = harness.time_calls(lambda: calls.append(1), repeats=4, warmup=1, clock=clock)
    assert len(calls) == 5
    assert timing.warmup_seconds == (9,)
    assert timing.seconds == (3, 1, 2, 5)
    assert (timing.median, timing.min, timing.max) == (2.5, 1, 5)
    assert str(timing) == "median 2.5 s (min 1, max 5, 4 runs)"


def test_each_timed_call_is_blocked_on_before_the_clock_stops():
    events = []

    class Pending:
        def block_until_ready(self):
            events.append("blocked")
            return self

    def clock():
        events.append("clock")
        return float(len(events))

    harness.time_calls(lambda: {"out": Pending()}, repeats=2, warmup=0, clock=clock)
    assert events == ["clock", "blocked", "clock"] * 2
    array = jnp.arange(3.0) * 2  # a JAX array passes through, computed
    assert harness.block_until_ready(array) is array


def test_interleaved_calls_alternate_round_by_round():
    order = []
    # Rounds (a, b): warm-up (4, 8), then (1, 2), (3, 6), (2, 4) timed.
    clock = ScriptedClock([0, 4, 0, 8, 0, 1, 0, 2, 0, 3, 0, 6, 0, 2, 0, 4])
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    timings = harness.time_interleaved(fns, repeats=3, warmup=1, clock=clock)
    assert order == ["a", "b"] * 4
    assert timings["a"] == harness.Timing(seconds=(1, 3, 2), warmup_seconds=(4,))
    assert timings["b"] == harness.Timing(seconds=(2, 6, 4), warmup_seconds=(8,))
    assert (timings["a"].median, timings["b"].median) == (2, 4)


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        harness.time_calls(lambda: None, repeats=0)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | env
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env, capture_output=True, text=True
    )


def test_pin_threads_sets_the_one_thread_flags_before_jax_and_refuses_after():
    before = _python(
        "import os\nfrom benchmarks import harness\nharness.pin_threads(1)\n"
        "print(os.environ['XLA_FLAGS'])",
        XLA_FLAGS="--xla_dump_to=/nowhere",
    )
    assert before.returncode == 0, before.stderr
    assert before.stdout.strip() == "--xla_dump_to=/nowhere " + harness.XLA_ONE_THREAD
    after = _python("import jax\nfrom benchmarks import harness\nharness.pin_threads(1)")
    assert after.returncode != 0
    assert "pin_threads must run before jax is imported" in after.stderr
    untouched = _python(
        "import os\nfrom benchmarks import harness\nharness.pin_threads(2)\n"
        "print(os.environ.get('XLA_FLAGS'))"
    )
    assert untouched.stdout.strip() == "None"


def test_source_revision_names_the_commit_and_a_dirty_tree(tmp_path):
    assert harness.source_revision(tmp_path) == "commit unknown (not a git checkout)"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("one\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert harness.source_revision(tmp_path) == f"commit {commit} (clean tree)"
    (tmp_path / "untracked.txt").write_text("not part of the revision\n")
    assert harness.source_revision(tmp_path) == f"commit {commit} (clean tree)"
    (tmp_path / "a.txt").write_text("two\n")
    assert harness.source_revision(tmp_path) == (
        f"commit {commit} + uncommitted changes to tracked files (dirty tree)"
    )


def test_header_names_the_script_revision_and_load(monkeypatch):
    monkeypatch.setattr(harness, "source_revision", lambda: "commit abc1234 (clean tree)")
    monkeypatch.setattr(harness, "load_average", lambda: 1.5)
    monkeypatch.setenv("XLA_FLAGS", harness.XLA_ONE_THREAD)
    assert harness.header("x --quick") == (
        f"x --quick | commit abc1234 (clean tree) | load average 1.50 ({os.cpu_count()} CPUs) "
        f"| XLA_FLAGS {harness.XLA_ONE_THREAD}"
    )
    monkeypatch.delenv("XLA_FLAGS")
    assert harness.header("x").endswith("CPUs)")


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_benchmarks_import_each_other_as_a_package_and_never_edit_sys_path():
    """`python -m benchmarks.X` from the repository root puts the root, not benchmarks/ or
    scripts/, on sys.path: a bare `import step_throughput` would fail there."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    siblings = {p.stem for p in scripts} | {p.stem for p in (ROOT / "scripts").glob("*.py")}
    assert len(scripts) > 20
    for path in scripts:
        bare = {m for m in _imported_modules(path) if m.split(".")[0] in siblings}
        assert not bare, f"{path.name} imports {sorted(bare)} by bare name"
        assert "sys.path" not in path.read_text(), path.name
