"""Verdicts per CPU second: the project's scorer against bare math-verify, same completions, one run.

    python -m benchmarks.rewards_vs_math_verify                 # 400 completions
    python -m benchmarks.rewards_vs_math_verify --num 1000 --seed 1
    python -m benchmarks.rewards_vs_math_verify --group 8 --workers 4   # groups, 4 workers

The completions are those of benchmarks/rewards.py (the training set's golds in the styles a
policy writes). Each variant scores all of them in this process, one after the other, and is
timed in CPU seconds (this process and its forked children), so the figure is verdicts/s per
core and a loaded machine changes it less than wall time would:

- `math-verify`: bare `parse(gold)`, `parse(completion)`, `verify` (math-verify's own
  extraction and timeouts off, as the scorer runs it);
- `score_one, no budget`: the project's scorer in this process, `max_work_calls = 0`;
- `score_one`: the same with the work budget (CPython's C profiler counting calls);
- `score_isolated`: each item in a fresh fork of this process (the determinism guarantee,
  docs/rewards.md#time-outs-are-decided-by-work-not-by-the-clock); this process holds the data
  loader's libraries too, so its forks cost more than a worker's;
- `score_item`: what a worker does per item: in this process where math-verify's parser is
  never needed (integer answers, screened or missing answers), else, where other items share
  its gold (`--group`), in a fork of a process that has read that gold once
  (isolate.GoldServer), else `score_isolated`;
- `fork alone`: a fork of this process, a trivial call in the child and its exit;
- `pool, 1 worker`: what training runs, `RewardPool` with one worker (a fork of the
  rewards-only forkserver) scoring each item as `score_item` does, timed in the worker's CPU
  seconds and its children's (Linux /proc). The in-process rows run after the bare math-verify
  pass over the same completions, and `score_isolated` / `score_item` fork this process, whose
  ANTLR prediction cache those passes warmed: only this row starts from a worker's state.
  `--workers N`: N workers, their CPU summed (training's default is 4: a group's items go to
  one worker where they can, scorer.next_position, so its gold is read once).

Prints each variant's verdicts/s, its ratio to bare math-verify, and the load average.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from math_verify import parse, verify

from benchmarks.rewards import make_completions  # the sibling benchmark's completions
from dynamo_jax.rewards import RewardConfig, RewardPool, score_one
from dynamo_jax.rewards.isolate import call_isolated, score_isolated, score_item
from dynamo_jax.rewards.math_check import NeedsParser, without_parser
from dynamo_jax.rewards.worker import warm_up


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (the forks)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _worker_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a worker (its waited-for forks included), and the same
    of its live children (its gold's server and what that has waited for), recursively."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children")
    live = children.read_text().split() if children.exists() else []
    return own + sum(_worker_cpu_s(int(child)) for child in live)


def _gold_source(gold: str) -> str:
    """The gold as math-verify parses it: boxed, unless it carries its own `$...$`."""
    return gold if "$" in gold else "\\boxed{" + gold + "}"


def bare_math_verify(text: str, gold: str) -> bool:
    gold_parsed = parse(_gold_source(gold), parsing_timeout=None)
    return bool(verify(gold_parsed, parse(text, parsing_timeout=None), timeout_seconds=None))


def _bare_phases(text: str, gold: str) -> tuple[float, float, float]:
    """CPU seconds of bare math-verify's gold parse, answer parse and verify, in that order."""
    start = time.process_time()
    gold_parsed = parse(_gold_source(gold), parsing_timeout=None)
    parsed = time.process_time()
    answer = parse(text, parsing_timeout=None)
    answered = time.process_time()
    verify(gold_parsed, answer, timeout_seconds=None)
    return parsed - start, answered - parsed, time.process_time() - answered


def needs_parser(text: str, gold: str, cfg: RewardConfig) -> bool:
    """Whether the scorer reaches math-verify's parser for this item (else a worker scores it
    without a fork)."""
    try:
        with without_parser():
            score_one(text, gold, cfg)
    except NeedsParser:
        return True
    return False


def fork_split(texts: list[str], golds: list[str], cfg: RewardConfig) -> dict[str, float]:
    """Where a forked item's CPU goes, per item that needs the parser (mean CPU ms): the fork
    itself, bare math-verify's three phases in a fresh fork of this (warm) process, and the
    scorer's whole `score_isolated`."""
    items = [(t, g) for t, g in zip(texts, golds) if needs_parser(t, g, cfg)]
    totals = dict.fromkeys(("fork alone", "gold parse", "answer parse", "verify"), 0.0)
    totals["score_isolated"] = 0.0
    for text, gold in items:
        cpu = _cpu_s()
        call_isolated(len, text)
        totals["fork alone"] += _cpu_s() - cpu
        phases = call_isolated(_bare_phases, text, gold)
        for name, seconds in zip(("gold parse", "answer parse", "verify"), phases):
            totals[name] += seconds
        cpu = _cpu_s()
        score_isolated(text, gold, cfg)
        totals["score_isolated"] += _cpu_s() - cpu
    return {"items": len(items), **{k: 1e3 * v / max(len(items), 1) for k, v in totals.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workers", type=int, default=1, help="the pool's workers (CPU summed over all of them)"
    )
    parser.add_argument(
        "--group",
        type=int,
        default=1,
        help="consecutive completions sharing a problem (a GRPO group; 1: none share)",
    )
    parser.add_argument(
        "--split", action="store_true", help="only where a forked item's CPU goes, per phase"
    )
    args = parser.parse_args()
    texts, golds = make_completions(args.num, seed=args.seed, group=args.group)
    cfg = RewardConfig(timeout_s=20.0)
    no_budget = RewardConfig(timeout_s=20.0, max_work_calls=0)
    warm_up(cfg)
    if args.split:
        split = fork_split(texts, golds, cfg)
        print(f"{split.pop('items')} of {args.num} completions (seed {args.seed}) need the parser;")
        print("per such item, CPU ms in a fork of this warm process (bare math-verify's phases):")
        for name, ms in split.items():
            print(f"  {name:15s} {ms:6.1f}")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        return
    variants = {
        "math-verify": lambda t, g: bare_math_verify(t, g),
        "score_one, no budget": lambda t, g: score_one(t, g, no_budget),
        "score_one": lambda t, g: score_one(t, g, cfg),
        "score_isolated": lambda t, g: score_isolated(t, g, cfg),
        "score_item": lambda t, g: score_item(t, g, cfg, gold_shared=args.group > 1),
        "fork alone": lambda t, g: call_isolated(len, t),
    }
    for text, gold in zip(texts[:20], golds[:20]):  # every variant past its first-use costs
        for fn in variants.values():
            fn(text, gold)
    print(
        f"{args.num} completions (seed {args.seed}, groups of {args.group}), one process, "
        "CPU time incl. forks"
    )
    rates = {}
    for name, fn in variants.items():
        cpu, wall = _cpu_s(), time.perf_counter()
        for text, gold in zip(texts, golds):
            fn(text, gold)
        cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
        rates[name] = args.num / cpu
        print(
            f"{name:22s} {rates[name]:7.1f} verdicts/s per core  ({1e3 * cpu / args.num:6.2f} "
            f"CPU ms each, {wall:.1f} s wall)  {rates['math-verify'] / rates[name]:.2f}x "
            "math-verify's cost"
        )
    with RewardPool(RewardConfig(num_workers=args.workers, timeout_s=20.0)) as pool:
        pool.score(texts[:20], golds[:20])
        pids = pool.worker_pids()
        cpu, wall = sum(map(_worker_cpu_s, pids)), time.perf_counter()
        pool.score(texts, golds)
        cpu, wall = sum(map(_worker_cpu_s, pids)) - cpu, time.perf_counter() - wall
        replaced = pool.worker_pids() != pids
    rate = args.num / cpu
    name = f"pool, {args.workers} worker{'s' if args.workers > 1 else ''}"
    print(
        f"{name:22s} {rate:7.1f} verdicts/s per core  ({1e3 * cpu / args.num:6.2f} "
        f"CPU ms each, {wall:.1f} s wall)  {rates['math-verify'] / rate:.2f}x "
        f"math-verify's cost{'  (worker replaced: incomplete)' if replaced else ''}"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
