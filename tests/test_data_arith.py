"""The arithmetic task's data: deterministic, in the readers' layout, no train/test overlap."""

import json
import re
from pathlib import Path

from dynamo_jax.data import arith, load_files

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "arith"


def _key(row):
    """The split key: the level and the operand pair (unordered for + and ×)."""
    nums = [int(n) for n in re.findall(r"\d+", row["prompt"])]
    a, b = nums[-2:]
    op = "-" if ("-" in row["prompt"] or "away" in row["prompt"]) else "+*"
    if op != "-":
        a, b = sorted((a, b))
        op = "*" if ("×" in row["prompt"] or "packs" in row["prompt"]) else "+"
    return row["source"], op, a, b


def test_committed_files_are_the_generators_output(tmp_path):
    train, test = arith.write(tmp_path / "a", seed=0)
    assert train.read_bytes() == (DATA / "train.jsonl").read_bytes()
    assert test.read_bytes() == (DATA / "test.jsonl").read_bytes()
    again = arith.write(tmp_path / "b", seed=0)
    assert again[0].read_bytes() == train.read_bytes()
    assert arith.write(tmp_path / "c", seed=1)[0].read_bytes() != train.read_bytes()


def test_no_problem_of_the_test_split_is_trained_on():
    train, test = arith.make_splits(0)
    assert {r["prompt"] for r in train}.isdisjoint(r["prompt"] for r in test)
    # Not even commuted or reworded: the operand pairs of a level are disjoint too.
    assert {_key(r) for r in train}.isdisjoint(_key(r) for r in test)
    assert len({r["id"] for r in train + test}) == len(train) + len(test)


def test_answers_are_right_and_levels_interleaved():
    train, test = arith.make_splits(0)
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for row in train + test:
        level, op, a, b = _key(row)
        assert int(row["answer"]) == ops[op](a, b), row
        if level in ("add2", "sub2"):
            assert 10 <= min(a, b) and max(a, b) <= 99
    assert [r["source"] for r in test[:5]] == list(arith.LEVELS)
    counts = {lvl: sum(r["source"] == lvl for r in test) for lvl in arith.LEVELS}
    assert counts == {"add1": 5, "add2": 40, "sub2": 40, "mul1": 40, "word": 40}


def test_the_readers_take_the_files():
    rows, _ = load_files((str(DATA / "test.jsonl"),), fmt="auto", on_bad_row="error", id_field="id")
    assert len(rows) == 165 and rows[0].source == "add1" and rows[0].gold == "10"
    assert rows[0].messages == ({"role": "user", "content": "What is 9 + 1?"},)
    first = json.loads((DATA / "train.jsonl").read_text().splitlines()[0])
    assert set(first) == {"id", "prompt", "answer", "source"}
