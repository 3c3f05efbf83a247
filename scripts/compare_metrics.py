"""Two runs' metrics.jsonl, line by line, with the wall-clock fields left out: identical or not.

    python scripts/compare_metrics.py BEFORE/metrics.jsonl AFTER/metrics.jsonl
    python scripts/compare_metrics.py A B --ignore time/ perf/ eval/

A refactor that changes no behaviour must give the same file as before, bit for bit, once the
fields that measure time are dropped (keys starting with one of `--ignore`'s prefixes; default
`time/` and `perf/`). Values are compared as parsed JSON, so 0.1 and 0.10 are the same number but
0.1 and 0.1000001 are not. Exit status 0 when the files agree, 1 with the first differences listed
(at most `--show`), 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_IGNORE = ("time/", "perf/")


def load(path: Path, ignore: tuple[str, ...]) -> list[dict]:
    """The file's lines as dicts without the ignored keys (an unreadable line is an error)."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON: {err}") from err
        rows.append({k: v for k, v in row.items() if not k.startswith(ignore)})
    return rows


def differences(a: list[dict], b: list[dict]) -> list[str]:
    """Every disagreement: the line count, then per line the keys present in one file only and
    the keys whose values differ."""
    out = []
    if len(a) != len(b):
        out.append(f"line count: {len(a)} != {len(b)}")
    for number, (x, y) in enumerate(zip(a, b), 1):
        for key in sorted(x.keys() - y.keys()):
            out.append(f"line {number}: {key!r} only in the first file")
        for key in sorted(y.keys() - x.keys()):
            out.append(f"line {number}: {key!r} only in the second file")
        for key in sorted(x.keys() & y.keys()):
            if x[key] != y[key]:
                out.append(f"line {number}: {key!r}: {x[key]!r} != {y[key]!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument(
        "--ignore",
        nargs="*",
        default=list(DEFAULT_IGNORE),
        help="key prefixes to leave out (default: %(default)s)",
    )
    parser.add_argument("--show", type=int, default=20, help="differences to print at most")
    args = parser.parse_args(argv)
    ignore = tuple(args.ignore)
    try:
        a, b = load(args.first, ignore), load(args.second, ignore)
    except (OSError, ValueError) as err:
        print(f"compare_metrics: {err}", file=sys.stderr)
        return 2
    diffs = differences(a, b)
    if diffs:
        print(f"{len(diffs)} difference(s) (ignoring keys starting {list(ignore)}):")
        print("\n".join(diffs[: args.show]))
        return 1
    keys = len(a[0]) if a else 0
    print(f"identical: {len(a)} lines, {keys} keys in the first (ignoring {list(ignore)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
