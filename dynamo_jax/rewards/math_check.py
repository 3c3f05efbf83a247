"""Score one completion against a gold answer with math-verify, inside a CPU-time limit.

This module runs inside the reward worker processes (and in-process for tests and
benchmarks). math-verify's own timeouts (wall-clock `signal.alarm` per parser call) are switched
off and replaced by one CPU-time deadline around the whole item (`ITIMER_PROF` → SIGPROF): the
caller wants one limit per completion, and CPU time keeps verdicts independent of machine load.
Our deadline exception derives from `BaseException` so the `except Exception` blocks inside
math-verify and SymPy cannot swallow it.

A signal cannot interrupt long C calls (a big-integer power such as `9^{9^{9^9}}`); the pool in
`scorer.py` kills and replaces a worker that overruns the deadline for that reason.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading

from math_verify import parse, verify

from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.extract import last_boxed, max_nesting_depth
from dynamo_jax.rewards.verdict import Status, Verdict


class _DeadlineExceeded(BaseException):
    """Raised by SIGPROF at the per-item deadline (BaseException: see module docstring)."""


class _DropDisabledTimeoutWarning(logging.Filter):
    # We disable math-verify's timeouts on purpose and enforce our own; its warning about
    # that would otherwise be logged once per worker.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


def reward_for(status: Status, cfg: RewardConfig) -> float:
    """The configured reward of a status: correct, no answer, or anything else (= wrong)."""
    if status == "correct":
        return float(cfg.correct_reward)
    if status == "no_answer":
        return float(cfg.no_answer_reward)
    return float(cfg.wrong_reward)


def make_verdict(status: Status, cfg: RewardConfig, answer=None, detail: str = "") -> Verdict:
    return Verdict(reward_for(status, cfg), status, answer, detail)


def precheck(text, cfg: RewardConfig) -> Verdict | None:
    """Verdict for input rejected before parsing (wrong type, too long), else None.

    Cheap enough for the parent process, so oversized strings are never even sent to a worker.
    """
    if not isinstance(text, str):
        return make_verdict("parse_error", cfg, detail=f"completion is {type(text).__name__}")
    if len(text) > cfg.max_chars:
        return make_verdict(
            "parse_error", cfg, detail=f"completion has {len(text)} chars > max_chars"
        )
    return None


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # Golds are LaTeX fragments ("\\frac{3}{5}", "025", "(5,\\infty)"); some carry their own
    # `$...$` (e.g. "$8$,$4$"), which math-verify's environment regexes handle directly.
    source = gold if "$" in gold else "\\boxed{" + gold + "}"
    return tuple(parse(source, parsing_timeout=None))


@contextlib.contextmanager
def _time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise _DeadlineExceeded()

    previous = signal.signal(signal.SIGPROF, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _extract(text: str, cfg: RewardConfig) -> tuple[list | None, str | None, Verdict | None]:
    """(parsed prediction, answer string, early verdict). Bounds are checked before parsing."""
    boxed = last_boxed(text)
    source = text if boxed is None else boxed
    limit = cfg.max_chars if boxed is None else cfg.max_answer_chars
    if len(source) > limit:
        return (
            None,
            None,
            make_verdict("parse_error", cfg, detail="answer longer than max_answer_chars"),
        )
    if max_nesting_depth(source) > cfg.max_nesting:
        return (
            None,
            None,
            make_verdict("parse_error", cfg, detail="nesting deeper than max_nesting"),
        )
    if boxed is None:
        # No box: math-verify's own extraction ("the answer is ...", last LaTeX environment, ...).
        predicted = parse(text, parsing_timeout=None)
        if not predicted:
            return None, None, make_verdict("no_answer", cfg, detail="no extractable answer")
        return predicted, str(predicted[-1]), None
    if not boxed:
        return None, "", make_verdict("no_answer", cfg, answer="", detail="empty \\boxed{}")
    predicted = parse("\\boxed{" + boxed + "}", parsing_timeout=None)
    if not predicted:
        return (
            None,
            boxed,
            make_verdict("parse_error", cfg, answer=boxed, detail="unparseable answer"),
        )
    return predicted, boxed, None


def _score_unbounded(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return make_verdict("parse_error", cfg, detail="gold answer is empty or unparseable")
    predicted, answer, early = _extract(text, cfg)
    if early is not None:
        return early
    ok = verify(list(gold_parsed), predicted, timeout_seconds=None)
    return make_verdict("correct" if ok else "wrong", cfg, answer=answer)


def score_one(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    """Score one completion in this process within `cfg.timeout_s` CPU seconds (main thread).

    Never raises for bad completion text: every failure becomes a verdict. A non-string gold is
    a caller bug and raises TypeError.
    """
    if not isinstance(gold, str):
        raise TypeError(f"gold answer must be a str, got {type(gold).__name__}")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "score_one enforces its time limit with a signal: call it on the main thread"
        )
    early = precheck(text, cfg)
    if early is not None:
        return early
    try:
        with _time_limit(cfg.timeout_s):
            return _score_unbounded(text, gold, cfg)
    except _DeadlineExceeded:
        return make_verdict("timeout", cfg, detail=f"exceeded {cfg.timeout_s} CPU s")
    except (Exception, RecursionError, MemoryError) as exc:  # parser bugs on hostile input
        return make_verdict("parse_error", cfg, detail=f"{type(exc).__name__} while parsing")
