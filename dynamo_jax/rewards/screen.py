"""Screens that refuse hedged, code-like or degenerate final answers before any parser sees them.

RL learns whatever earns reward, and math-verify is generous by design: it finds *a* number in
"The final answer is 42(lambda: 0)()", accepts `\\boxed{41 \\lor 42}` against 42 and ignores
TeX it does not know (`\\boxed{\\foo 42}`). Each screen here is a linear-time string scan that
returns the reason a completion earns nothing, or None. They run on normalised text
(normalise.py: one spelling per symbol, so `∨` is `\\lor` and `12–13` is `12 to 13`). The rule
they implement (written for users in docs/rewards.md#one-final-answer):

    The scorer reads one final answer: the last non-empty box, else the last cue's clause,
    else the last sentence with math. A final answer that holds more than one value earns 0:
    a disjunction or a range the gold does not have; where the gold is one value, a list,
    `\\pm`, "and", numbers side by side or two values in a clause of prose; a word in a
    numeric box that is neither a unit nor the gold's. So does code, TeX programming or a
    macro outside the known math vocabulary, or a completion that is one token repeated
    thousands of times.
"""

from __future__ import annotations

import re
import zlib

# TeX that changes what later text means: nothing a final answer needs, anywhere in a completion.
_TEX_PROGRAMMING = re.compile(
    r"\\(?:catcode|def|edef|gdef|xdef|let|futurelet|newcommand|renewcommand|providecommand|"
    r"DeclareMathOperator|DeclareRobustCommand|csname|endcsname|expandafter|noexpand|"
    r"uppercase|lowercase|input|include|write|immediate|makeatletter|makeatother|char|"
    r"mathchardef|chardef|countdef|afterassignment|globaldefs|scantokens|detokenize|"
    r"mathcode|lccode|uccode|active|obeyspaces|everymath|everydisplay)(?![A-Za-z])"
)

# The math vocabulary a final answer may use (macros only; `\\{`, `\\,` ... are not names).
_KNOWN_MACROS = frozenset(
    """
    frac dfrac tfrac cfrac sqrt cdot times div pm mp le leq ge geq lt gt neq ne approx infty
    leqslant geqslant ll gg parallel
    infinity pi circ degree left right big Big bigg Bigg bigl bigr Bigl Bigr text textbf textit
    textrm mathrm mathbf mathit mathsf mathtt mathbb mathcal mathfrak mbox operatorname boxed
    fbox displaystyle textstyle scriptstyle quad qquad cup cap setminus emptyset varnothing
    in notin subset subseteq supset supseteq sin cos tan cot sec csc arcsin arccos arctan sinh
    cosh tanh log ln lg exp lim sum prod int oint min max gcd lcm deg det mod bmod pmod
    cdots ldots dots dotsb dotsc vdots ddots overline underline hat bar vec tilde widehat
    widetilde binom dbinom tbinom choose angle measuredangle triangle perp sim simeq cong
    equiv propto to rightarrow Rightarrow leftarrow Leftarrow leftrightarrow implies iff
    mapsto begin end matrix pmatrix bmatrix vmatrix Bmatrix array cases forall exists
    partial nabla prime lfloor rfloor lceil rceil langle rangle lvert rvert lVert rVert vert
    Vert mid colon ast star dagger percent negmedspace negthickspace phantom hspace
    alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu
    xi omicron rho varrho sigma varsigma tau upsilon phi varphi chi psi omega
    Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega
    """.split()
)
_MACRO = re.compile(r"\\([A-Za-z]+)")

# Words and symbols that offer a choice of answers.
_DISJUNCTION = re.compile(
    r"\\(?:lor|vee|bigvee)(?![A-Za-z])|(?<![\\A-Za-z])(?i:or|either)(?![A-Za-z])"
)
# A range between two numbers ("12 to 13"; normalise.py writes "12–13" so).
_RANGE = re.compile(r"\d\s*(?:(?<!\\)\bto\b|\.\.\.?)\s*[-+]?\d")
# Markdown bold around an answer (`**12**`), not Python's power between operands (`9**9`).
_BOLD = re.compile(r"(?<![0-9A-Za-z)}\]])\*\*|\*\*(?![0-9A-Za-z({\[])")
# An answer that is numbers side by side, apart only by space ("12 13", `12 \\quad 13`): two
# values (a signed one, `12 -13`, is a difference; `\\sin^2 80` and `\\dfrac 3 8` are one).
_JUXTAPOSED = re.compile(
    r"\s*[-+]?\d+(?:\.\d+)?(?:(?:\s|\\quad|\\qquad|\\[,;: ]|~)+\d+(?:\.\d+)?)+\s*"
)
# Two values where one is expected (checked only when the gold is one value).
_CONJUNCTION = re.compile(r"\\(?:pm|mp|land|wedge)(?![A-Za-z])|(?<![\\A-Za-z])(?i:and)(?![A-Za-z])")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")

# Where a final answer without a box starts ("The final answer is", "Answer:").
# The clause may start on a later line ("The final answer is:\n\n$$12$$").
_CUE = re.compile(r"(?i)\banswer\b\s*(?:\*\*)?\s*(?:is\b\s*:?|:|=)\s*(?:\*\*)?\s*")
# Code in the clause after the cue: statements, calls, conditionals, attribute access.
_CODE = re.compile(
    r"__|;|`|==|!=|:=|->|\bimport\b|\blambda\b|\bprint\b|\beval\b|\bexec\b"
    r"|\bif\b|\belse\b|\bfor\b|\bwhile\b|\breturn\b|\bdef\b|\bclass\b|\bnot\b"
    r"|(?<![\\A-Za-z])[A-Za-z_][A-Za-z_0-9]+\s*\(|\)\s*\(|\d\s*\(|[\w)\]]\.[A-Za-z_]"
)
# A parenthesis that holds words only, after a space ("12 (twelve)", "(in cm)"), is prose, not
# a call (`foo(bar)`).
PROSE_PARENTHESIS = re.compile(r"\s+\((?:[A-Za-z][A-Za-z' ,.-]*)\)")
# A clause ends at a newline or at sentence punctuation followed by a space (or the end).
_CLAUSE_END = re.compile(r"\n|[.!?](?=\s|$)")
_CLAUSE_MAX = 300

# Degenerate repetition: a long completion that compresses more than 50-fold is one short unit
# repeated (an honest chain of thought compresses 2-4 fold; "42 " * 30000 about 300 fold).
_REPETITION_MIN_CHARS = 4096
_REPETITION_MAX_RATIO = 0.02


def tex_programming(text: str) -> str | None:
    match = _TEX_PROGRAMMING.search(text)
    return f"TeX programming ({match.group(0)})" if match else None


def degenerate_repetition(text: str) -> str | None:
    if len(text) < _REPETITION_MIN_CHARS:
        return None
    raw = text.encode("utf-8", "surrogatepass")
    ratio = len(zlib.compress(raw, 1)) / len(raw)
    if ratio < _REPETITION_MAX_RATIO:
        return f"degenerate repetition (compresses {1 / ratio:.0f}-fold)"
    return None


def completion_reason(text: str) -> str | None:
    """Why a whole completion earns nothing before its answer is looked at, or None."""
    return tex_programming(text) or degenerate_repetition(text)


def top_level_parts(answer: str) -> list[str]:
    """`answer` split at `,` and `;` outside brackets and braces (thousands separators kept)."""
    if _THOUSANDS.fullmatch(answer.replace(" ", "").strip("$")):
        return [answer]
    parts, depth, start = [], 0, 0
    for pos, char in enumerate(answer):
        if char in "{([":
            depth += 1
        elif char in "})]" and depth > 0:
            depth -= 1
        elif char in ",;" and depth == 0 and (pos == 0 or answer[pos - 1] != "\\"):
            parts.append(answer[start:pos])
            start = pos + 1
    parts.append(answer[start:])
    return [p for p in (p.strip() for p in parts) if p]


def is_single_value(gold: str) -> bool:
    """True when the gold answer is one value (not a list, set, interval, tuple or `\\pm`)."""
    stripped = gold.strip().strip("$").strip()
    if re.match(r"\\left\s*[(\[]|[(\[]|\\\{|\\lbrace", stripped):
        return False
    if re.search(r"\\(?:cup|cap|pm|mp)(?![A-Za-z])|\$\s*,", stripped):
        return False
    return len(top_level_parts(stripped)) <= 1


# Units a number may carry in a box or a number answer (`\\boxed{12 \\text{ cm}}`): real units,
# not any word, so `\\boxed{12 \\text{ maybe thirteen}}` is not the number 12.
UNITS = frozenset(
    """
    mm cm dm m km in inch inches ft foot feet yd yard yards mi mile miles
    mg g kg lb lbs pound pounds oz ounce ounces ton tons t
    ml mL l L liter liters litre litres gal gallon gallons cup cups
    s sec second seconds min minute minutes h hr hrs hour hours day days week weeks
    month months year years
    mph kph
    dollar dollars cent cents USD euro euros
    degree degrees deg rad radian radians percent
    unit units square cubic sq cu
    meter meters metre metres centimeter centimeters millimeter millimeters kilometer
    kilometers gram grams kilogram kilograms
    """.split()
)
_WRAPPED_TEXT = re.compile(
    r"\\(?:text|textrm|textbf|textit|mbox|mathrm|operatorname)\s*\{([^{}]*)\}"
)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}(?![A-Za-z])")


def _stray_word(answer: str, gold: str) -> str | None:
    """A word in a box that holds a number, other than a unit or a word of the gold."""
    if not re.search(r"\d", answer):
        return None  # a text answer (`\\text{Thursday}`): math-verify compares it
    opened = _WRAPPED_TEXT.sub(r" \1 ", answer)
    gold_words = set(_WORD.findall(_WRAPPED_TEXT.sub(r" \1 ", gold)))
    for word in _WORD.findall(opened):
        if word not in UNITS and word not in gold_words:
            return word
    return None


def answer_reason(answer: str, gold: str) -> str | None:
    """Why an extracted final answer (a box's content) earns nothing, or None."""
    words = _text_words(answer)
    reason = _several_answers(answer, words, gold)
    if reason is not None:
        return reason
    if is_single_value(gold):
        if _CONJUNCTION.search(words) and not _CONJUNCTION.search(gold):
            return "several final answers where the gold is one value"
        if len(top_level_parts(answer)) > 1:
            return "a list of answers where the gold is one value"
        if _JUXTAPOSED.fullmatch(answer) and not _JUXTAPOSED.fullmatch(gold.strip("$ ")):
            return "several values in the final answer where the gold is one value"
    gold_macros = set(_MACRO.findall(gold))  # the gold's own notation (`\\mho`) is known
    for name in _MACRO.findall(answer):
        if name not in _KNOWN_MACROS and name not in gold_macros:
            return f"unknown TeX macro \\{name} in the final answer"
    word = _stray_word(answer, gold)
    if word is not None:
        return f"the final answer holds a word that is not a unit ({word!r})"
    return None


def _several_answers(answer: str, words: str, gold: str) -> str | None:
    """The checks every final answer gets, boxed or in prose: a disjunction or a range, or
    `\\mid` outside a set, that the gold does not have itself (`words`: the answer's words)."""
    if _hedged(words, gold):
        return "several final answers (a disjunction or a range)"
    if _mid_outside_set(answer, gold):
        return "several final answers (\\mid outside a set)"
    return None


def _mid_outside_set(answer: str, gold: str) -> bool:
    """`\\mid` that is not a set's "such that", where the gold has none (`3 \\mid n`)."""
    if "\\mid" not in answer or "\\mid" in gold:
        return False
    return "\\{" not in answer and "\\lbrace" not in answer


def _hedged(words: str, gold: str) -> bool:
    """A disjunction or a range that the gold does not itself contain (a gold may be prose:
    "Primes 2 and 5 appear seven or more times", or two spellings joined by "OR")."""
    gold_words = _text_words(gold)
    return bool(
        (_DISJUNCTION.search(words) and not _DISJUNCTION.search(gold_words))
        or (_RANGE.search(words) and not _RANGE.search(gold_words))
    )


def _text_words(answer: str) -> str:
    """`answer` with `\\text{...}`-like wrappers opened, so `\\text{ or }` reads as ` or `."""
    return re.sub(r"\\(?:text|textrm|textbf|textit|mbox|mathrm|operatorname)\s*\{", " {", answer)


def clause_values(clause: str) -> list[str]:
    """The math in a clause of prose, split at its words and top-level `,` / `;`.

    "12 apples" holds one value, "12 Or 13", "12, 13", "12 13" and "x = 6 so y = 4" two: prose
    words (two letters or more, not a macro) and space between numbers separate values, a
    parenthesis of words is dropped.
    """
    text = PROSE_PARENTHESIS.sub(" ", clause)
    text = _WRAPPED_TEXT.sub(r" \1 ", text)
    text = _BOLD.sub(" ", re.sub(r"\$|\\[()\[\]]", " ", text))
    text = _WORD.sub(";", text)
    parts = [
        part
        for part in top_level_parts(text)
        if re.search(r"[0-9A-Za-z]", part) and part.strip(" .!?:") not in ("", "a", "A", "I")
    ]
    return [v for p in parts for v in (p.split() if _JUXTAPOSED.fullmatch(p.rstrip(".")) else [p])]


def cue_clause(text: str) -> str | None:
    """The clause after the last "answer is" / "Answer:" cue, or None when there is no cue."""
    last = None
    for match in _CUE.finditer(text):
        last = match
    if last is None:
        return None
    rest = text[last.end() : last.end() + _CLAUSE_MAX]
    skip = 0
    for opener, closer in (("$$", "$$"), ("\\[", "\\]")):  # display math spans lines
        if rest.startswith(opener):
            close = rest.find(closer, len(opener))
            skip = close + len(closer) if close >= 0 else 0
    end = _CLAUSE_END.search(rest, skip)
    return rest[: end.start()] if end else rest


def prose_dropped(clause: str) -> str:
    """A clause's math alone: `\\text{}` opened, parentheses of words, words and `.` dropped."""
    text = PROSE_PARENTHESIS.sub(" ", clause)
    text = _WRAPPED_TEXT.sub(r" \1 ", text)
    text = _BOLD.sub(" ", text)
    return _WORD.sub(" ", text).strip().rstrip(".!?:").strip()


def last_math_sentence(text: str) -> str | None:
    """The last sentence of `text` that holds a digit or math, without a box or a cue."""
    tail = text[-2 * _CLAUSE_MAX :]
    sentences = re.split(r"\n|[.!?](?=\s|$)", tail)
    for sentence in reversed(sentences):
        if re.search(r"[0-9$\\]", sentence):
            return sentence.strip()
    return None


def clause_reason(clause: str, gold: str) -> str | None:
    """Why a final answer in prose (a cue's clause, the last sentence) earns nothing, or None."""
    code = _CODE.search(PROSE_PARENTHESIS.sub(" ", clause))
    if code:
        return f"code-like final answer ({code.group(0).strip()!r})"
    words = _text_words(clause)
    reason = _several_answers(clause, words, gold)
    if reason is not None:
        return reason
    if is_single_value(gold):
        if _CONJUNCTION.search(words):
            return "several final answers where the gold is one value"
        if len(clause_values(clause)) > 1:
            return "several values in the final answer where the gold is one value"
    return None


def unboxed_reason(text: str, gold: str) -> str | None:
    """Why a completion without a box earns nothing (code or hedging in its answer), or None."""
    clause = cue_clause(text)
    if clause is None:
        clause = last_math_sentence(text)
    return None if clause is None else clause_reason(clause, gold)
