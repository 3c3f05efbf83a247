"""Entry point of a reward worker process: receive (index, text, gold, source, extra_info,
gold_shared), send (index, Verdict).

Kept apart from the pool so that the forkserver can preload exactly this module (math-verify,
SymPy and the ANTLR grammar) once, making a replacement worker a cheap fork.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import resource
from multiprocessing.connection import Connection
from pathlib import Path

from dynamo_jax.rewards import isolate, math_check
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.isolate import score_item
from dynamo_jax.rewards.math_check import score_one
from dynamo_jax.rewards.user import load_function, score_user

# First message of every worker: it is warm and ready for items (their deadlines start later).
READY = "ready"
# Or, instead, (START_FAILED, one-line reason) when the user's reward function cannot be loaded.
START_FAILED = "start_failed"


def _cap_memory(limit_mb: int) -> None:
    if limit_mb <= 0:
        return
    limit = limit_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def worker_main(conn: Connection, cfg: RewardConfig) -> None:
    """Serve scoring requests until the pipe closes or a None message arrives."""
    _cap_memory(cfg.worker_memory_mb)
    # Already warm when forked from the preloaded forkserver; under spawn this keeps first-use
    # costs out of the first items' time limits. One pass of the default cases in both: every
    # item is scored from this warm state (isolate.py).
    if not _warm:
        warm_up()
    function = None
    if cfg.function:
        try:
            function = load_function(cfg.function)
        except ValueError as exc:
            conn.send((START_FAILED, str(exc)))
            return
    conn.send(READY)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, text, gold, source, extra_info, gold_shared = message
        if function is None:
            if isolate.available():
                verdict = score_item(text, gold, cfg, gold_shared=gold_shared)
            else:
                verdict = score_one(text, gold, cfg)
            conn.send((index, verdict))
        else:
            conn.send((index, score_user(function, text, gold, source, extra_info, cfg)))


# One example per answer shape: the first parse of each shape costs 0.2-0.7 s (SymPy's lazy
# imports and caches, the ANTLR parser's tables), later ones a few ms.
_WARM_UP_CASES = (
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{(1, \\infty)}", "(1,\\infty)"),
    ("\\boxed{x^2+\\sqrt{2}x+1}", "1+x^2+\\sqrt{2}x"),
    ("\\boxed{\\text{Thursday}}", "Thursday"),
    ("\\boxed{1, 3}", "$1$,$3$"),
    ("\\boxed{540^\\circ}", "10\\%"),
    ("The answer is 3/4.", "025"),
    # Every item is scored from this warm state (isolate.py), so the parser's prediction cache
    # never grows past what these build: the common answer shapes are parsed here once.
    ("So the answer is \\boxed{-12}.", "-12"),
    ("\\boxed{3.75}", "\\frac{15}{4}"),
    ("\\boxed{\\dfrac{-3}{7}}", "-\\frac{3}{7}"),
    ("\\boxed{2\\sqrt{3} - \\frac{\\pi}{6}}", "2\\sqrt{3}-\\frac{\\pi}{6}"),
    (
        "\\boxed{\\left( -\\frac{5}{11}, \\frac{12}{11} \\right)}",
        "\\left(-\\frac{5}{11},\\frac{12}{11}\\right)",
    ),
    ("\\boxed{[-2, 5) \\cup (7, \\infty)}", "[-2,5)\\cup(7,\\infty)"),
    ("\\boxed{\\{1, 2, 3\\}}", "\\{1,2,3\\}"),
    ("\\boxed{y = 2x + 3}", "y=2x+3"),
    ("\\boxed{15 \\cdot 2013!}", "15(2013!)"),
    (
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
        "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
    ),
    ("\\boxed{5 \\text{ cm}^2}", "5"),
    ("\\boxed{\\mathbf{2340}}", "\\mathbf{2340}"),
    ("\\boxed{66_8}", "66_8"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{3+4i}", "3+4i"),
    ("\\boxed{\\log_2 8 + e^{2}}", "3+e^2"),
    ("\\boxed{|x - 1| \\le 2}", "-1 \\le x \\le 3"),
    ("The final answer is $\\frac{7}{2}$.", "3.5"),
    ("Answer: 1,000", "1000"),
)


# The parser's prediction cache (ANTLR's DFA) is what makes a parse cheap: a lookahead it does
# not hold costs ~9 CPU ms to compute, and every item's fork computes it again (isolate.py). So
# the warm-up also parses a fixed list of real answers: the distinct non-integer golds of the
# validation split (data/math/valid.parquet), in file order, the same in every worker.
_WARM_UP_ANSWERS = Path(__file__).with_name("warm_up_answers.json")


def warm_up_answers() -> list[tuple[str, str]]:
    """(completion, gold) pairs of the fixed answers, in the order every worker scores them."""
    answers = json.loads(_WARM_UP_ANSWERS.read_text(encoding="utf-8"))
    return [(f"So the answer is $\\boxed{{{answer}}}$.", answer) for answer in answers]


_warm = False  # set once warm_up has run in this process (or in the forkserver it came from)


def warm_up(cfg: RewardConfig | None = None) -> None:
    """Pay the parsers' first-use costs once (in the forkserver, so forked workers start warm)."""
    cfg = cfg or RewardConfig()
    for text, gold in _WARM_UP_CASES:
        score_one(text, gold, cfg)
    # Uncounted (half the CPU): counting calls changes nothing in the parsers' state.
    uncounted = dataclasses.replace(cfg, max_work_calls=0)
    for text, gold in warm_up_answers():
        score_one(text, gold, uncounted)
    # Every item's fork starts from here: with SymPy's and math-verify's caches already empty,
    # its own reset frees nothing (freeing the warm-up's objects cost each fork ~5-9 CPU ms of
    # copy-on-write), and with the collector's objects frozen, a collection in this process
    # between items does not write to the pages its forks share. `re`'s template cache is empty
    # here as after every item scored in this process (isolate.score_item).
    math_check._reset_state()
    math_check.forget_regex_templates()
    gc.collect()
    gc.freeze()
    global _warm
    _warm = True
