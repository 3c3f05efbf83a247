"""Arithmetic and one-sentence word problems at several difficulty levels (data/arith/).

    python -m dynamo_jax.data.arith --out data/arith       # rewrites train.jsonl and test.jsonl

Deterministic: the same seed gives the same files, byte for byte. Each level's problems are
drawn from its own space of operand pairs; a pair (unordered for + and ×) lands in exactly one
split, so no test question, nor its commuted twin, is ever trained on. Rows are JSONL in the
readers' layout: `prompt` (the question alone; the config adds the instruction), `answer` (an
integer string), `source` (the level, so evaluation reports per level), `id`.

Levels (source names):
    add1  a + b, one digit each                       (55 unordered pairs in all)
    add2  a + b, two digits each
    sub2  a - b, two digits each, a >= b
    mul1  a × b, a two-digit, b one digit (2..9)
    word  one sentence: someone has a things, gets / gives away / packs b; how many now?
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

LEVELS = ("add1", "add2", "sub2", "mul1", "word")
# problems per level in each split (a level with fewer distinct problems gives what it has,
# split in the same proportion)
TRAIN_PER_LEVEL = 400
TEST_PER_LEVEL = 40

_NAMES = ("Tom", "Ana", "Sam", "Lena", "Omar", "Mia", "Raj", "Zoe", "Ben", "Ivy")
_THINGS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells")
_WORD_OPS = {
    "+": "{n} has {a} {t} and gets {b} more. How many {t} does {n} have now?",
    "-": "{n} has {a} {t} and gives away {b}. How many {t} does {n} have left?",
    "*": "{n} packs {b} {t} into each of {a} bags. How many {t} does {n} pack in total?",
}


def _pairs(level: str) -> list[tuple[str, int, int]]:
    """Every (op, a, b) of a level, in a fixed order (the split key: a commuted pair is one)."""
    if level == "add1":
        return [("+", a, b) for a in range(10) for b in range(a, 10)]
    if level == "add2":
        return [("+", a, b) for a in range(10, 100) for b in range(a, 100)]
    if level == "sub2":
        return [("-", a, b) for a in range(10, 100) for b in range(10, a + 1)]
    if level == "mul1":
        return [("*", a, b) for a in range(10, 100) for b in range(2, 10)]
    if level == "word":
        return (
            [("+", a, b) for a in range(2, 50) for b in range(a, 50)]
            + [("-", a, b) for a in range(10, 60) for b in range(2, a)]
            + [("*", a, b) for a in range(2, 13) for b in range(a, 13)]
        )
    raise ValueError(f"unknown level {level!r}; levels: {LEVELS}")


def _value(op: str, a: int, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def _question(level: str, op: str, a: int, b: int, rng: random.Random) -> str:
    if op in "+*" and rng.random() < 0.5:
        a, b = b, a  # either order is asked; the pair is still one split key
    if level == "word":
        return _WORD_OPS[op].format(n=rng.choice(_NAMES), t=rng.choice(_THINGS), a=a, b=b)
    sign = {"+": "+", "-": "-", "*": "×"}[op]
    return f"What is {a} {sign} {b}?"


def make_splits(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows), levels interleaved so any prefix covers every level."""
    train_by: dict[str, list[dict]] = {}
    test_by: dict[str, list[dict]] = {}
    for level in LEVELS:
        rng = random.Random(f"{seed}:{level}")
        pairs = _pairs(level)
        rng.shuffle(pairs)
        total = TRAIN_PER_LEVEL + TEST_PER_LEVEL
        n_test = max(1, round(min(total, len(pairs)) * TEST_PER_LEVEL / total))
        n_train = min(TRAIN_PER_LEVEL, len(pairs) - n_test)
        chosen = {"test": pairs[:n_test], "train": pairs[n_test : n_test + n_train]}
        for split, out in (("train", train_by), ("test", test_by)):
            out[level] = [
                {
                    "id": f"{level}-{split}-{i}",
                    "prompt": _question(level, op, a, b, rng),
                    "answer": str(_value(op, a, b)),
                    "source": level,
                }
                for i, (op, a, b) in enumerate(chosen[split])
            ]
    return _interleave(train_by), _interleave(test_by)


def _interleave(by_level: dict[str, list[dict]]) -> list[dict]:
    out = []
    longest = max(len(v) for v in by_level.values())
    for i in range(longest):
        out += [rows[i] for rows in by_level.values() if i < len(rows)]
    return out


def write(out_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in zip(("train", "test"), make_splits(seed)):
        path = out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        paths.append(path)
    return paths[0], paths[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/arith", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write(Path(args.out), args.seed):
        print(f"wrote {path} ({sum(1 for _ in path.open())} rows)")


if __name__ == "__main__":
    main()
