"""Reward scoring throughput: the worker pool vs a single process, on real-style completions.

    python -m benchmarks.rewards                    # 10,000 completions, workers = CPU count
    python -m benchmarks.rewards --num 2000 --workers 4

Completions are built from the training set's real gold answers in the styles a policy
produces: a reasoning preamble (the problem restated, some LaTeX), then the gold in a box,
a wrong box, an equivalent rewrite, a revised second box, "the answer is ..." without a box,
or no answer at all. Both sides score the same list; the peer is `score_one` in this process
(same parser, same time limit). Prints verdicts/s of each and the ratio pool / single.

It also prints the cost of making each verdict independent of earlier items (`score_one`
clears SymPy's and math-verify's caches before every item): the first `--reset_num`
completions scored again in this process with that reset switched off (caches kept across
items) and on, in CPU time. Both passes run after the single-process pass, whose first sight
of each answer also warms state that the reset leaves alone and that only affects speed (the
ANTLR parser's lazily built DFA), so neither pass pays that cost for the other.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import time
from pathlib import Path

from dynamo_jax.data import load_rows
from dynamo_jax.rewards import RewardConfig, RewardPool, math_check, score_one

TRAIN = Path(__file__).resolve().parents[1] / "data" / "math" / "train.parquet"


def _wrong(gold: str, rng: random.Random, golds: list[str]) -> str:
    if gold.lstrip("-").isdigit():
        return str(int(gold) + rng.choice([-2, -1, 1, 10]))
    return rng.choice(golds)


def _rewrite(gold: str) -> str:
    """An equivalent spelling: integers lose leading zeros, fractions become \\dfrac."""
    if gold.isdigit():
        return str(int(gold))
    return gold.replace("\\frac", "\\dfrac").replace(" ", "")


def make_completions(num: int, seed: int = 0, group: int = 1) -> tuple[list[str], list[str]]:
    """`num` completions of training problems; `group` consecutive ones share a problem, as a
    GRPO group's completions do (group=1: each draws its own)."""
    rows = [r for r in load_rows(TRAIN) if r.gold.strip()]
    golds_pool = [r.gold for r in rows]
    rng = random.Random(seed)
    texts, golds = [], []
    for index in range(num):
        if index % group == 0:
            row = rng.choice(rows)
        gold, problem = row.gold, row.messages[-1]["content"]
        preamble = (
            f"Let me restate the problem. {problem}\n\nWe set up the equations step by step: "
            "$x + y = 10$, $x - y = 2$, so $x = 6$ and $y = 4$. Checking: $6 \\cdot 4 = 24$.\n"
        )
        style = rng.choices(
            ["box", "wrong", "rewrite", "revised", "plain", "none"], [40, 20, 10, 10, 10, 10]
        )[0]
        answer = {
            "box": f"Therefore the final answer is $\\boxed{{{gold}}}$.",
            "wrong": f"Therefore the final answer is $\\boxed{{{_wrong(gold, rng, golds_pool)}}}$.",
            "rewrite": f"So we get \\boxed{{{_rewrite(gold)}}}.",
            "revised": f"So \\boxed{{{_wrong(gold, rng, golds_pool)}}}. Wait, recheck: \\boxed{{{gold}}}.",
            "plain": f"The answer is {gold}.",
            "none": "Hmm, this needs more work on the second case, where",
        }[style]
        texts.append(preamble + answer)
        golds.append(gold)
    return texts, golds


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of processes (Linux /proc), to see past a loaded machine."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--timeout_s", type=float, default=5.0)
    parser.add_argument("--reset_num", type=int, default=2000)
    args = parser.parse_args()
    texts, golds = make_completions(args.num)
    cfg = RewardConfig(num_workers=args.workers, timeout_s=args.timeout_s)
    print(
        f"{args.num} completions, mean {sum(map(len, texts)) / len(texts):.0f} chars; "
        f"{args.workers} workers, CPU count {os.cpu_count()}"
    )

    start, cpu = time.perf_counter(), time.process_time()
    single = [score_one(t, g, cfg) for t, g in zip(texts, golds)]
    single_s, single_cpu = time.perf_counter() - start, time.process_time() - cpu

    n = min(args.num, args.reset_num)
    reset_cpu = {}
    reset = math_check._reset_state
    for mode in ("kept", "reset"):
        math_check._reset_state = reset if mode == "reset" else (lambda: None)
        try:
            cpu = time.process_time()
            again = [score_one(t, g, cfg) for t, g in zip(texts[:n], golds[:n])]
            reset_cpu[mode] = time.process_time() - cpu
        finally:
            math_check._reset_state = reset
        if mode == "kept":
            agree_kept = sum(a.status == b.status for a, b in zip(single, again))

    with RewardPool(cfg) as pool:
        pool.score(texts[:16], golds[:16])  # workers up and warm before the clock starts
        pids, cpu = pool.worker_pids(), _cpu_s(pool.worker_pids())
        start = time.perf_counter()
        pooled = pool.score(texts, golds)
        pool_s = time.perf_counter() - start
        same = pids == pool.worker_pids()  # no worker replaced: CPU figures are complete
        pool_cpu = _cpu_s(pids) - cpu if same else float("nan")

    agree = sum(a.status == b.status for a, b in zip(single, pooled))
    print("statuses (single):", dict(collections.Counter(v.status for v in single)))
    print(f"single process : {args.num / single_s:8.1f} verdicts/s  ({single_s:.1f} s)")
    print(f"pool ({args.workers} workers): {args.num / pool_s:8.1f} verdicts/s  ({pool_s:.1f} s)")
    print(f"ratio pool / single: {single_s / pool_s:.2f}x; identical statuses: {agree}/{args.num}")
    print(
        f"CPU ms per verdict: single {1e3 * single_cpu / args.num:.2f}, "
        f"pool workers {1e3 * pool_cpu / args.num:.2f}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"per-item state reset ({n} completions): {1e3 * reset_cpu['reset'] / n:.2f} CPU ms per "
        f"verdict vs {1e3 * reset_cpu['kept'] / n:.2f} with caches kept across items; ratio "
        f"{reset_cpu['reset'] / reset_cpu['kept']:.2f}x; identical statuses: {agree_kept}/{n}"
    )


if __name__ == "__main__":
    main()
