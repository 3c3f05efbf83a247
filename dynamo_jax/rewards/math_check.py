"""Score one completion against a gold answer with math-verify, inside a CPU-time limit.

This module runs inside the reward worker processes (and in-process for tests and
benchmarks). math-verify's own timeouts (wall-clock `signal.alarm` per parser call) are switched
off and replaced by one CPU-time deadline around the whole item (`ITIMER_PROF` → SIGPROF): the
caller wants one limit per completion, and CPU time keeps verdicts independent of machine load.
Our deadline exception derives from `BaseException` so the `except Exception` blocks inside
math-verify and SymPy cannot swallow it.

A signal cannot interrupt long C calls (a big-integer power such as `9^{9^{9^9}}`); the pool in
`scorer.py` kills and replaces a worker that overruns the deadline for that reason.

A verdict is a function of (completion, gold) alone, whatever the process scored before and
whatever its PYTHONHASHSEED. Three pieces of process state used to leak into verdicts:
- SymPy's assumption queries (`expr.is_zero`, ...) visit related facts in an order shuffled by
  an unseeded RNG, from a set of fact names whose iteration order follows the hash seed. For
  an expression whose assumption handlers contradict each other, such as the unevaluated
  `Pow(oo, oo)` that `\\infty^{\\infty}` parses to, the answer depended on that order:
  `(1 - oo**oo).is_zero` came out True in some processes, scoring `\\infty^{\\infty}` equal
  to any number. The order is made a fixed one (sorted) once, at import.
- SymPy's expression cache, math-verify's parse caches and our gold cache hand back objects
  built for earlier items together with the assumptions computed on them, and results that
  make a repeated expensive item (a symbolic matrix power) instant where a fresh process times
  out. They are cleared before every item (`_reset_state`), and SymPy's RNG is reseeded.
- Infinities stay unevaluated in math-verify's parse (`\\infty^{2}` is `Pow(oo, 2)`), where
  SymPy's assumptions are not consistent; parsed answers that contain one are evaluated
  (`doit`: `oo**oo` becomes `oo`) before they are compared.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import signal
import threading

import sympy
import sympy.core.random
from math_verify import parse, verify
from math_verify import parser as _mv_parser
from sympy.core.cache import clear_cache

from dynamo_jax.rewards import budget, number, screen
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.extract import box_spans, matching_braces, max_nesting_depth
from dynamo_jax.rewards.normalise import normalise
from dynamo_jax.rewards.verdict import Verdict, make_verdict


class DeadlineExceeded(BaseException):
    """Raised by SIGPROF at the per-item deadline (BaseException: see module docstring)."""


class _DropDisabledTimeoutWarning(logging.Filter):
    # We disable math-verify's timeouts on purpose and enforce our own; its warning about
    # that would otherwise be logged once per worker.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropDisabledTimeoutWarning())


def _fix_assumption_order() -> None:
    # SymPy shuffles the facts an assumption query visits to expose inconsistent handlers in
    # its own test suite (see `_ask` in sympy/core/assumptions.py); a reward must not depend on
    # them, so the facts are visited in sorted order instead: the same in every process.
    # (By module path: `sympy.core.assumptions` as an attribute is a function of that name.)
    module = importlib.import_module("sympy.core.assumptions")
    if not callable(getattr(module, "shuffle", None)):
        raise ImportError(
            "sympy.core.assumptions.shuffle not found: this SymPy version orders assumption "
            "queries differently; check that verdicts are still deterministic before using it"
        )
    module.shuffle = list.sort


_fix_assumption_order()

# math-verify's own memoised parsers (their results carry SymPy objects from earlier items).
_PARSE_CACHES = (
    _mv_parser.parse_latex_cached,
    _mv_parser.parse_expr_cached,
    _mv_parser.extract_latex,
)
_SYMPY_SEED = 0
# Honest completions box one answer, or revise it a few times; more is spam, refused unparsed.
_MAX_BOXES = 16
_INFINITIES = (sympy.S.Infinity, sympy.S.NegativeInfinity, sympy.S.ComplexInfinity)


def _reset_state() -> None:
    """Forget everything earlier items left in SymPy and math-verify (see module docstring)."""
    clear_cache()
    for cache in _PARSE_CACHES:
        cache.cache_clear()
    sympy.core.random.seed(_SYMPY_SEED)


# The `re` module's memo of compiled replacement templates (an lru_cache: it can be emptied,
# not put back); its name changed in Python 3.12.
_RE_TEMPLATES = getattr(re, "_compile_repl", None) or getattr(re, "_compile_template", None)


def forget_regex_templates() -> None:
    """Empty `re`'s template cache: the worker's warm state holds none (worker.warm_up)."""
    if _RE_TEMPLATES is not None:
        _RE_TEMPLATES.cache_clear()


def _evaluate_infinities(item):
    """`item` with its arithmetic parts that contain an infinity evaluated (`oo**oo` → `oo`).

    Unevaluated, such an expression has contradictory assumptions, and comparisons built on
    them (`(1 - oo**oo).is_zero`) say nothing about the mathematics. Relations, sets and tuples
    keep their structure (only their parts are evaluated), so `\\lim_{x\\to\\infty} f(x) = 3`
    stays an equation whose right side math-verify compares, rather than collapsing to True.
    """
    if not isinstance(item, sympy.Basic) or not item.has(*_INFINITIES):
        return item
    try:
        if isinstance(item, sympy.Expr):
            return item.doit()
        args = [_evaluate_infinities(arg) for arg in item.args]
        with sympy.evaluate(False):
            return item.func(*args)
    except Exception:  # what SymPy cannot evaluate is compared as parsed
        return item


def _imaginary_unit(item):
    """`item` with the symbol `i` read as the imaginary unit (the documented convention).

    latex2sympy parses `i` as a plain symbol, so `\\boxed{i^2}` was `wrong` against -1 while
    `3+4i` matched `3+4i` only as a polynomial in a variable. A final answer has no free index
    variable named i, so both the gold and the answer read it as sqrt(-1).
    """
    if not isinstance(item, sympy.Basic | sympy.MatrixBase):
        return item
    units = {s: sympy.I for s in item.free_symbols if getattr(s, "name", None) == "i"}
    if not units:
        return item
    try:
        return item.xreplace(units)
    except Exception:  # what SymPy cannot rebuild is compared as parsed
        return item


# An integer literal, alone or as the whole of one box: what math-verify's parse returns for it
# is known (`[Integer(n), "n"]`), and its ANTLR parser is most of an item's cost.
_INTEGER_SOURCE = re.compile(r"(\\boxed\{)?(-?(?:0|[1-9][0-9]{0,99}))(?(1)\})")


class NeedsParser(BaseException):
    """Raised instead of parsing while `without_parser` is on (isolate.score_item); a
    BaseException, so that no `except Exception` on the way turns it into a verdict."""


class _Parser:
    allowed = True


@contextlib.contextmanager
def without_parser():
    """Raise `NeedsParser` where math-verify's parser would run (see isolate.score_item)."""
    _Parser.allowed = False
    try:
        yield
    finally:
        _Parser.allowed = True


def _parsed(source: str) -> list:
    integer = _INTEGER_SOURCE.fullmatch(source)
    if integer is not None:  # equal to parse's own result (tests/test_rewards_math_check.py)
        return [sympy.Integer(integer[2]), integer[2]]
    if not _Parser.allowed:
        raise NeedsParser()
    return [
        _imaginary_unit(_evaluate_infinities(item)) for item in parse(source, parsing_timeout=None)
    ]


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


def matching_braces_open(text: str) -> list[int]:
    """Positions of the structural `{` that no `}` closes."""
    closed = matching_braces(text)
    return [
        pos
        for pos, char in enumerate(text)
        if char == "{" and pos not in closed and not (pos and text[pos - 1] == "\\")
    ]


def gold_text(gold: str) -> str:
    """The gold with its own boxes and display delimiters opened (`\\[\\boxed{(7, 11)}\\]` is
    `(7, 11)`) and its unclosed braces closed: a gold is the value, not a completion."""
    spans = box_spans(gold)
    for start, end in reversed(spans):
        braced = gold[start - 1 : start] == "{"
        if braced and not any(s < start and end < e for s, e in spans):  # outermost only
            macro = gold.rfind("\\", 0, start)
            gold = gold[:macro] + gold[start:end] + gold[end + 1 :]
    if "\\[" in gold:
        gold = re.sub(r"\\[\[\]]", " ", gold).strip()
    gold = re.sub(r"(?<=\D)\.\s*$", "", gold)  # `30^\\circ.`: a sentence's period
    unclosed = len(matching_braces_open(gold))
    return gold + "}" * unclosed  # a gold whose braces do not close (a data defect) closed


def _parse_gold(gold: str) -> list:
    # Golds are LaTeX fragments ("\\frac{3}{5}", "025", "(5,\\infty)"); some carry their own
    # `$...$` (e.g. "$8$,$4$"), which math-verify's environment regexes handle directly. Parsed
    # again for every item: a cached parse would carry assumptions computed for earlier items.
    gold = drop_percent(gold)
    if gold.count("$") % 2:  # unbalanced delimiters (`$221,$8$`): the math without them
        gold = gold.replace("$", " ")
    source = gold if "$" in gold else "\\boxed{" + gold + "}"
    return _parsed(source)


_DEADLINE = {"fired": False}  # whether the last time_limit's deadline passed


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        _DEADLINE["fired"] = True  # kept even if a library's bare `except:` swallows the raise
        raise DeadlineExceeded()

    _DEADLINE["fired"] = False

    previous = signal.signal(signal.SIGPROF, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _bounds(source: str, limit: int, cfg: RewardConfig) -> Verdict | None:
    if len(source) > limit:
        return make_verdict("parse_error", cfg, detail="answer longer than max_answer_chars")
    if max_nesting_depth(source) > cfg.max_nesting:
        return make_verdict("parse_error", cfg, detail="nesting deeper than max_nesting")
    return None


def _boxes(text: str, gold: str, cfg: RewardConfig) -> tuple[list[str], Verdict | None]:
    """The distinct contents of the closed boxes, last one last (or the verdict refusing them).

    Every box is screened (`screen.answer_reason`) and bounded: an earlier box is a committed
    answer too, so `\\boxed{41 \\lor 42} ... \\boxed{42}` is a disjunction.
    """
    spans = box_spans(text)
    if len(spans) > _MAX_BOXES:
        return [], make_verdict("wrong", cfg, detail=f"more than {_MAX_BOXES} boxed answers")
    distinct: dict[str, str] = {}
    for start, end in spans:
        content = text[start:end].strip()
        if not content:  # "I will put the answer in \\boxed{}": an empty box is no answer
            continue
        key = re.sub(r"\s+", "", content)
        distinct.pop(key, None)  # re-inserted: the order is that of last occurrences
        distinct[key] = content
    boxes = list(distinct.values())
    for content in boxes:
        early = _bounds(content, cfg.max_answer_chars, cfg)
        reason = screen.answer_reason(content, gold) if content else None
        if early is not None or reason is not None:
            return boxes, early or make_verdict("wrong", cfg, answer=content, detail=reason)
    return boxes, None


_PERCENT = re.compile(r"\s*(?:\\%|%|\\percent)\s*\.?\s*$")
_MATH_DELIMITERS = re.compile(r"\$|\\[(\[]")
# Numbers closer than this (relative) are one value; math-verify rounds to 6 decimals, which
# made 1e-7 equal to 4e-7.
_RELATIVE_TOLERANCE = 1e-9


def drop_percent(answer: str) -> str:
    """`answer` without a trailing percent sign: `50\\%` is 50 in both formats (one reading)."""
    return _PERCENT.sub("", answer)


def _parse_clause(clause: str) -> list:
    """A prose answer parsed: its math as written when delimited; else, with its words dropped,
    as LaTeX when it has a macro (`2\\sqrt{3}` undelimited was 2 to math-verify's plain-text
    reading), as a plain expression otherwise (`9**9`, `3/4`)."""
    if _MATH_DELIMITERS.search(clause):
        return _parsed(drop_percent(clause))
    math = drop_percent(screen.prose_dropped(clause))
    if re.search(r"[-+*/=^]\s*$|^\s*[*/=^]", math):  # an operand was a word: "42 + foo"
        return []
    return _parsed("\\boxed{" + math + "}" if "\\" in math else math)


def _extract(
    text: str, gold: str, cfg: RewardConfig
) -> tuple[list | None, str | None, Verdict | None]:
    """(parsed prediction, answer string, early verdict). Bounds are checked before parsing.

    The one final answer: the last non-empty box (every box must hold the same value), else
    the clause after the last "answer is" / "Answer:" cue, else the last sentence with math.
    """
    boxes, early = _boxes(text, gold, cfg)
    if early is not None:
        return None, None, early
    if not boxes:
        clause = screen.cue_clause(text)
        if clause is None:
            clause = screen.last_math_sentence(text)
        if clause is None:
            return None, None, make_verdict("no_answer", cfg, detail="no extractable answer")
        reason = screen.clause_reason(clause, gold)
        if reason is not None:
            return None, None, make_verdict("wrong", cfg, answer=clause, detail=reason)
        early = _bounds(clause, cfg.max_answer_chars, cfg)
        if early is not None:
            return None, None, early
        predicted = _parse_clause(clause)
        if not predicted:
            return None, None, make_verdict("no_answer", cfg, detail="no extractable answer")
        return predicted, clause.strip(), None
    answer = boxes[-1]
    predicted = _parsed("\\boxed{" + drop_percent(answer) + "}")
    if not predicted:
        return (
            None,
            answer,
            make_verdict("parse_error", cfg, answer=answer, detail="unparseable answer"),
        )
    for other in boxes[:-1]:  # several boxes must all hold the same value
        if not verify(
            predicted, _parsed("\\boxed{" + drop_percent(other) + "}"), timeout_seconds=None
        ):
            return (
                None,
                answer,
                make_verdict(
                    "wrong",
                    cfg,
                    answer=answer,
                    detail="several boxed answers with different values",
                ),
            )
    return predicted, answer, None


def _several_values(predicted: list, gold_parsed: list) -> str | None:
    """Why a parsed answer holds more than one value where the gold holds one, or None.

    A set, tuple or interval (`12 \\pm 1` parses to a set of two), or an equation between two
    different numbers (`13 = 12`, which math-verify compares by one side).
    """
    answer, gold_value = predicted[0], gold_parsed[0]
    if isinstance(answer, sympy.Eq) and not answer.free_symbols:
        try:
            differ = abs(complex(sympy.N(answer.lhs - answer.rhs))) > _RELATIVE_TOLERANCE * max(
                1.0, abs(complex(sympy.N(answer.rhs)))
            )
        except (TypeError, ValueError):
            differ = False
        if differ:
            return "an equation between different values"
    single_gold = isinstance(gold_value, sympy.Expr) and not isinstance(gold_value, sympy.Tuple)
    many = isinstance(answer, sympy.Set | sympy.Tuple) and not (
        isinstance(answer, sympy.FiniteSet) and len(answer) == 1
    )
    if single_gold and many:
        return "several values in the final answer where the gold is one value"
    return None


def _same_text(answer: str, gold: str) -> bool:
    """The answer is the gold as written, up to spaces, `$` and a final period."""

    def key(text: str) -> str:
        return re.sub(r"[\s$]+", "", text).rstrip(".")

    return key(answer) == key(gold)


def _numbers_differ(gold_parsed: list, predicted: list) -> bool:
    """True when both are numbers that differ by more than the relative tolerance."""
    gold_value, answer = gold_parsed[0], predicted[0]
    finite = (sympy.Rational, sympy.Float)  # not oo, zoo or nan (Numbers too)
    if not (isinstance(gold_value, finite) and isinstance(answer, finite)):
        return False
    a, b = sympy.Rational(gold_value), sympy.Rational(answer)
    return abs(a - b) > _RELATIVE_TOLERANCE * max(abs(a), abs(b))


def _score_number(text: str, gold: str, cfg: RewardConfig) -> Verdict:
    """answer_format="number": the final answer must be a number literal (see number.py)."""
    boxes, early = _boxes(text, gold, cfg)
    if early is not None:
        return early
    if boxes:
        answer = boxes[-1]
        if not answer:
            return make_verdict("no_answer", cfg, answer="", detail="empty \\boxed{}")
        values = [number.number_value(b) for b in boxes]
        if any(v != values[-1] for v in values):
            return make_verdict(
                "wrong", cfg, answer=answer, detail="several boxed answers with different values"
            )
    else:
        reason = screen.unboxed_reason(text, gold)
        if reason is not None:
            return make_verdict("wrong", cfg, detail=reason)
        clause = screen.cue_clause(text)
        answer = number.cue_number(clause) if clause is not None else number.last_line_number(text)
        if answer is None:
            return make_verdict("no_answer", cfg, detail="no number as the final answer")
    value = number.number_value(answer)
    if value is None:
        return make_verdict("wrong", cfg, answer=answer, detail="final answer is not a number")
    gold_value = number.number_value(gold, lowest_terms=False)
    if gold_value is not None:
        return make_verdict("correct" if value == gold_value else "wrong", cfg, answer=answer)
    gold_parsed = _parse_gold(gold)  # a non-numeric gold (\\sqrt{2}): math-verify decides
    if not gold_parsed:
        return make_verdict("parse_error", cfg, detail="gold answer is empty or unparseable")
    ok = verify(gold_parsed, _parsed("\\boxed{" + answer + "}"), timeout_seconds=None)
    return make_verdict("correct" if ok else "wrong", cfg, answer=answer)


def read_gold(gold: str) -> tuple[str, list]:
    """The gold as completions are compared with it (normalised, its own boxes opened) and
    math-verify's parse of it: one call, which a prepared gold stands in for (gold.py)."""
    gold = gold_text(normalise(gold))
    return gold, _parse_gold(gold)


def _score_unbounded(text: str, gold: str, cfg: RewardConfig, prepared=None) -> Verdict:
    text = normalise(text)
    reason = screen.completion_reason(text)
    if reason is not None:
        return make_verdict("wrong", cfg, detail=reason)
    if cfg.answer_format == "number":
        return _score_number(text, gold_text(normalise(gold)), cfg)
    # `prepared` (gold.PreparedGold): this gold read, and counted, in the process this one was
    # forked from, from the state this item starts in.
    gold, gold_parsed = read_gold(gold) if prepared is None else prepared.take()
    if not gold_parsed:
        return make_verdict("parse_error", cfg, detail="gold answer is empty or unparseable")
    predicted, answer, early = _extract(text, gold, cfg)
    if early is not None:
        return early
    if _same_text(answer, gold):  # the gold as written (a prose gold parses unreliably)
        return make_verdict("correct", cfg, answer=answer)
    reason = _several_values(predicted, gold_parsed)
    if reason is not None:
        return make_verdict("wrong", cfg, answer=answer, detail=reason)
    ok = verify(gold_parsed, predicted, timeout_seconds=None)
    ok = ok and not _numbers_differ(gold_parsed, predicted)
    return make_verdict("correct" if ok else "wrong", cfg, answer=answer)


@contextlib.contextmanager
def _no_budget():
    budget.reset()
    yield


def score_one(text: str, gold: str, cfg: RewardConfig, prepared=None) -> Verdict:
    """Score one completion in this process within `cfg.timeout_s` CPU seconds (main thread).

    Never raises for bad completion text: every failure becomes a verdict. A non-string gold is
    a caller bug and raises TypeError. `prepared` (math mode): `gold.prepare_gold(gold, cfg)`,
    run in this process or the one it was forked from, and nothing else since (it reset the
    state this item starts from).
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
    if prepared is None:
        _reset_state()
    verdict = None
    try:
        counted = budget.work_budget(cfg.max_work_calls) if cfg.max_work_calls else _no_budget()
        with time_limit(cfg.timeout_s), counted:
            verdict = _score_unbounded(text, gold, cfg, prepared)
    except DeadlineExceeded:  # the safety net: work the budget does not count
        verdict = make_verdict("timeout", cfg, detail=f"exceeded {cfg.timeout_s} CPU s")
    except budget.WorkBudgetExceeded:
        pass
    except (Exception, RecursionError, MemoryError) as exc:  # parser bugs on hostile input
        verdict = make_verdict("parse_error", cfg, detail=f"{type(exc).__name__} while parsing")
    if budget.exceeded():  # also when a library swallowed the exception and went on
        return make_verdict(
            "timeout", cfg, detail=f"exceeded the work budget ({cfg.max_work_calls} calls)"
        )
    if _DEADLINE["fired"]:  # the same for the CPU deadline
        return make_verdict("timeout", cfg, detail=f"exceeded {cfg.timeout_s} CPU s")
    return verdict
