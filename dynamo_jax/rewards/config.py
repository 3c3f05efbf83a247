"""Configuration of the math reward: reward values, time limits and input bounds.

Completions are untrusted model output, so every bound that keeps a worker from hanging or
exhausting memory is an explicit, validated field here rather than a constant in the code.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import Literal

from dynamo_jax import validate

StartMethod = Literal["forkserver", "spawn"]
AnswerFormat = Literal["math", "number"]


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """How completions are scored against gold answers.

    Rewards: `correct_reward` for a verified answer, `no_answer_reward` when nothing could be
    extracted, `wrong_reward` for everything else (wrong, unparseable, timed out, too long).
    """

    # "math": math-verify equivalence (`\\boxed{2^{10}}` earns against 1024); "number": the
    # final answer must be a number literal (`\\boxed{86 + 66}` earns 0), see rewards/number.py.
    answer_format: AnswerFormat = "math"
    # "path/to/file.py:name": a user's reward function with verl's `custom_reward_function`
    # signature, run in the worker pool instead of math-verify (see rewards/user.py). "" = none.
    function: str = ""
    correct_reward: float = 1.0
    wrong_reward: float = 0.0
    no_answer_reward: float = 0.0
    # Work budget per completion, in Python function calls (parsing the gold and the answer and
    # comparing them; inside math-verify's LaTeX parser, its ANTLR closure steps instead: see
    # rewards/budget.py). An item past it is a "timeout" on every machine: the status is a
    # function of the input alone. Honest answers make 10 to 6*10^5.
    # Counting, and the fork an item that needs the parser is scored in, cost more than the
    # scoring (docs/rewards.md); 0 switches counting off (then only timeout_s decides, and a
    # status can depend on the machine's speed and load again).
    max_work_calls: int = 2_000_000
    # CPU-time limit per completion: only a safety net for work the budget does not count (a
    # loop making no calls), far above the ~1-2 CPU s the whole budget takes. CPU time, not wall
    # time, so that a loaded machine does not turn honest answers into timeouts. The worker
    # interrupts itself at this point (SIGPROF); C code that cannot be interrupted is killed by
    # the parent once the worker has used `kill_grace_s` more CPU seconds, and is replaced.
    timeout_s: float = 20.0
    kill_grace_s: float = 1.0
    # Wall-clock cap per completion in the pool, whatever the CPU use: catches a worker that
    # is blocked or stopped rather than computing.
    wall_timeout_s: float = 120.0
    # Completions longer than this are not parsed at all (status parse_error).
    max_chars: int = 100_000
    # The extracted final answer is bounded separately: math-verify parses it with an ANTLR
    # grammar and SymPy, whose cost grows quickly with length and nesting.
    max_answer_chars: int = 4096
    max_nesting: int = 64
    num_workers: int = 4
    start_method: StartMethod = "forkserver"
    # Address-space cap per worker (MiB), so a pathological expression fails with MemoryError
    # instead of taking the host's memory. 0 disables the cap.
    worker_memory_mb: int = 2048

    def __post_init__(self):
        for name in ("correct_reward", "wrong_reward", "no_answer_reward"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value != value:
                raise ValueError(f"RewardConfig.{name} must be a finite number, got {value!r}")
        validate.positive("RewardConfig", self, "timeout_s", "kill_grace_s")
        if not self.wall_timeout_s >= self.timeout_s + self.kill_grace_s:
            raise ValueError(
                f"RewardConfig.wall_timeout_s ({self.wall_timeout_s}) must be >= timeout_s + "
                f"kill_grace_s ({self.timeout_s + self.kill_grace_s})"
            )
        for name in (
            "max_chars",
            "max_answer_chars",
            "max_nesting",
            "num_workers",
        ):
            validate.int_at_least("RewardConfig", self, name, 1)
        validate.int_at_least("RewardConfig", self, "max_work_calls", 0)
        if self.answer_format not in ("math", "number"):
            raise ValueError(
                f"RewardConfig.answer_format must be 'math' or 'number', got {self.answer_format!r}"
            )
        if self.function:
            check_function_spec(self.function)
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError(
                "RewardConfig.start_method must be 'forkserver' or 'spawn' (fork is unsafe once "
                f"JAX is loaded), got {self.start_method!r}"
            )
        validate.int_at_least("RewardConfig", self, "worker_memory_mb", 0)


def split_function_spec(spec: str) -> tuple[str, str]:
    """("path/to/file.py", "name") of a `reward.function` value, or ValueError saying why not."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise ValueError(
            f"RewardConfig.function must be 'path/to/file.py:function_name', got {spec!r}"
        )
    return path, name


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_function_spec(spec: str) -> None:
    """Refuse a `reward.function` whose file is missing, is not Python, or does not define the
    name at top level: checked by reading the file, not running it (the workers import it, and
    report a failure there as one line too)."""
    path, name = split_function_spec(spec)
    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "no such file"
        raise ValueError(f"RewardConfig.function {spec!r}: {path}: {what}")
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(
            f"RewardConfig.function {spec!r}: {path}: cannot be read as Python "
            f"({type(exc).__name__}: {exc})"
        ) from None
    names = _defined_names(tree)
    if name not in names and "*" not in names:
        raise ValueError(f"RewardConfig.function {spec!r}: {path} defines no {name!r}")
