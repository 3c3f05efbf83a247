"""A work budget per completion: time-outs decided by work done, not by the clock.

A CPU-time limit makes the verdict of an expensive input depend on the machine and its load:
`\\boxed{{{{{{{{{{{{42}}}}}}}}}}}}` (12 nested braces) costs math-verify's ANTLR parser about
2 CPU s, 16 braces about 20 s, so near any limit its status (`timeout` vs `wrong`) came out
differently on a loaded host, a slower host, or after a different item. Here the work is
counted instead:

- Python function calls (frames entered), counted by CPython's C profiler (`_lsprof`, what
  `cProfile` runs; C functions are not counted): the same input makes the same calls, so an
  item past `max_work_calls` is a `timeout` wherever it runs. Honest answers make 10 to
  6*10^5 (counted as below); the default budget is 2*10^6. A trace function written in Python
  (`sys.settrace`) counted the same calls with about 1.6 times the overhead; what remains is
  Python 3.11's own: with any profile hook set, every instruction runs unspecialised (about
  2x slower). So math-verify's LaTeX parse (`PSParser.math`, ANTLR), most of an item's work,
  runs with the profiler off and counts instead each step of its prediction's closure (the
  recursive `closureCheckingStopState` of the parser, `closure` of the lexer: the work that
  grows exponentially on hostile input such as nested braces), one per step; the rest of the
  parse is linear in the tokens, which `max_answer_chars` bounds. The frames below the parse
  are counted once, when it switches the profiler off. The profiler counts a call when it
  returns, so the total is checked when the item ends, and, to
  cut a runaway item, every `_CHECK_EVERY_S` of user CPU time by a SIGVTALRM handler (its own
  calls are not counted). The clock decides
  only when a runaway is stopped, never the status: the count only grows, and the status is
  `timeout` exactly when the item's calls exceed the budget, whether counted to its end or cut.
- Powers of numbers, which SymPy hands to C or to mpmath (`9^{9^{9^9}}` never returns, and no
  signal can stop it): a power whose result (for a float: whose binary exponent) would exceed
  `_MAX_POWER_BITS` is refused by its size, before it is computed, and counts as the budget
  spent. This covers rational and float bases and exponents alike.

If a library swallows the budget exception (a bare `except:`), the flag stays set (and the
check raises again at its next tick), and the item is a `timeout` all the same when it ends.
The CPU-time limit (`RewardConfig.timeout_s`) stays, far above what the budget allows, only as
a safety net for work the budget does not see (a loop in one function making no calls).

Call counts could depend on the hash seed (set iteration order inside SymPy); the pool starts its
workers with a fixed PYTHONHASHSEED (scorer.py) so that even items at the edge of the budget get
the same status in every run.
"""

from __future__ import annotations

import _lsprof
import contextlib
import importlib
import math
import operator
import signal
import sys

# 2**20 bits (~315,000 digits) take milliseconds; every honest answer is far smaller.
_MAX_POWER_BITS = 1 << 20
# How often (user CPU seconds) a running item's count is compared with its budget.
_CHECK_EVERY_S = 0.05
_CODE = operator.attrgetter("code")
_CALLCOUNT = operator.attrgetter("callcount")


class WorkBudgetExceeded(BaseException):
    """Raised when an item has made its budget of calls (BaseException: nothing catches it by
    accident with `except Exception`)."""


class _Budget:
    active = False
    limit = 0
    exceeded = False
    made = 0
    profiler = None
    steps = 0  # closure steps of math-verify's LaTeX parser, counted instead of its calls


def _calls(profiler) -> int:
    """Returned calls of every function but the check itself (which runs when the clock says).

    C functions only (`map`, `attrgetter`, `dict`): a generator expression here would run
    Python frames, counted, a number of times that depends on the clock. The profiler keeps one
    entry per code object, and equal code objects (SymPy `eval`s the same text again) are equal
    keys: the sum is over the entries, the dict only finds the check's."""
    stats = profiler.getstats()
    by_code = dict(zip(map(_CODE, stats), map(_CALLCOUNT, stats)))
    return sum(map(_CALLCOUNT, stats)) - by_code.get(_CHECK_CODE, 0) + _Budget.steps


def _check(signum, frame):
    # Inlined `_calls` (a call here would be one more frame per check).
    profiler = _Budget.profiler
    if profiler is None:
        return
    stats = profiler.getstats()
    by_code = dict(zip(map(_CODE, stats), map(_CALLCOUNT, stats)))
    if sum(map(_CALLCOUNT, stats)) - by_code.get(_CHECK_CODE, 0) + _Budget.steps > _Budget.limit:
        _Budget.exceeded = True
        raise WorkBudgetExceeded()


_CHECK_CODE = _check.__code__


def reset() -> None:
    """No budget for the next item (`RewardConfig.max_work_calls = 0`)."""
    _Budget.limit, _Budget.exceeded, _Budget.active = 0, False, False


def exceeded() -> bool:
    """Whether the current (or last) budgeted item ran out of work, even if that was swallowed."""
    return _Budget.exceeded


@contextlib.contextmanager
def work_budget(calls: int):
    """Count Python calls made inside the block; raise `WorkBudgetExceeded` past `calls` (main
    thread only: the check is a signal handler)."""
    _Budget.limit, _Budget.exceeded, _Budget.active, _Budget.made = calls, False, True, 0
    _Budget.steps = 0
    profiler = _lsprof.Profiler(builtins=False, subcalls=False)
    previous = signal.signal(signal.SIGVTALRM, _check)
    signal.setitimer(signal.ITIMER_VIRTUAL, _CHECK_EVERY_S, _CHECK_EVERY_S)
    _Budget.profiler = profiler
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()  # calls still running are counted here
        _Budget.profiler = None
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
        _Budget.active = False
        _Budget.made = _calls(profiler)
        if _Budget.made > calls:
            _Budget.exceeded = True


def calls_made(function, *args) -> int:
    """How many calls `function(*args)` makes (for tests and for sizing the budget)."""
    with work_budget(sys.maxsize):
        function(*args)
    return _Budget.made


def last_made() -> int:
    """The count of the last budgeted block, also where it raised."""
    return _Budget.made


def add_prior_work(calls: int, exceeded: bool = False) -> None:
    """Count, as the current item's, `calls` made for it before it started: its gold's parse,
    done once in the process its fork came from (isolate.GoldServer). `exceeded`: that parse
    ran out of the budget itself."""
    _Budget.steps += calls
    _Budget.exceeded = _Budget.exceeded or exceeded


def _exponent_size(expt) -> float | None:
    """|expt| for a plain number (Integer, Rational or Float), else None; inf when it is past
    any float."""
    p, q = getattr(expt, "p", None), getattr(expt, "q", None)
    if isinstance(p, int) and isinstance(q, int):
        if abs(p).bit_length() - q.bit_length() > 1000:
            return float("inf")
        return abs(p) / q
    mpf = getattr(expt, "_mpf_", None)
    if mpf is not None:
        try:
            return abs(float(expt))
        except (OverflowError, ValueError):
            return float("inf")
    return None


def _base_size(base) -> float:
    """The bits a power of `base` grows by per unit of exponent: max(|p|, |q|)'s bit length for
    a rational (the exact result's size), |log2 |x|| for a float (its binary exponent's growth:
    1.0000001 ** 10**7 is about e and stays allowed, 9.0 ** 10**7 is not)."""
    p, q = getattr(base, "p", None), getattr(base, "q", None)
    if isinstance(p, int) and isinstance(q, int):
        return 0.0 if max(abs(p), abs(q)) <= 1 else float(max(abs(p), abs(q)).bit_length())
    _sign, mantissa, exponent, _bits = base._mpf_
    if not mantissa:
        return 0.0  # 0, or an infinity/NaN (mpmath computes those without work)
    return abs(math.log2(mantissa) + exponent)


def _refuse_huge_power(original):
    def _eval_power(self, expt):
        if _Budget.active:  # only inside a budgeted item
            size = _exponent_size(expt)
            # A Float exponent matters as much as an Integer one: math-verify's numeric check
            # turns `9**9**9**9` into Float(9) ** Float(9**387420489), which mpmath computes by
            # squaring through the exponent's billion bits.
            # (0 * inf is NaN, never above the limit: 1.0 ** huge is mpmath's cheap case.)
            if size is not None and size > 1 and _base_size(self) * size > _MAX_POWER_BITS:
                _Budget.exceeded = True
                raise WorkBudgetExceeded()
        return original(self, expt)

    _eval_power.__wrapped__ = original
    return _eval_power


def _install_power_guard() -> None:
    numbers = importlib.import_module("sympy.core.numbers")
    for cls in (numbers.Rational, numbers.Integer, numbers.Float):
        method = cls.__dict__.get("_eval_power")
        if method is None or hasattr(method, "__wrapped__"):
            continue
        cls._eval_power = _refuse_huge_power(method)


def _counting_steps(original):
    def step(self, *args):
        _Budget.steps += 1
        return original(self, *args)

    step.__wrapped__ = original
    return step


def _uncounted_parse(original):
    def parse(self):
        profiler = _Budget.profiler
        if profiler is None:
            return original(self)
        profiler.disable()  # the frames below this one are counted here, once (as returned)
        try:
            return original(self)
        finally:
            profiler.enable()

    parse.__wrapped__ = original
    return parse


def _install_parser_counting() -> None:
    """Count math-verify's LaTeX parse by its ANTLR closure steps, with the profiler off."""
    parser_atn = importlib.import_module("antlr4.atn.ParserATNSimulator").ParserATNSimulator
    lexer_atn = importlib.import_module("antlr4.atn.LexerATNSimulator").LexerATNSimulator
    latex = importlib.import_module("latex2sympy2_extended.antlr_parser").PSParser
    for cls, name, wrap in (
        (parser_atn, "closureCheckingStopState", _counting_steps),
        (lexer_atn, "closure", _counting_steps),
        (latex, "math", _uncounted_parse),
    ):
        method = cls.__dict__[name]
        if not hasattr(method, "__wrapped__"):
            setattr(cls, name, wrap(method))


_install_power_guard()
_install_parser_counting()
