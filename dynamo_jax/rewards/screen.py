"""Screens that refuse hedged, code-like or degenerate final answers before any parser sees them.

RL learns whatever earns reward, and math-verify is generous by design: it finds *a* number in
"The final answer is 42(lambda: 0)()", accepts `\\boxed{41 \\lor 42}` against 42 and ignores
TeX it does not know (`\\boxed{\\foo 42}`). Each screen here is a linear-time string scan that
returns the reason a completion earns nothing, or None. The rule they implement (written for
users in docs/rewards.md):

    A completion that commits to more than one final answer earns 0: several boxes with
    different values, a disjunction ("or", `\\lor`, `\\vee`), `\\pm`, or a list where the gold
    is one value. So does a final answer that is code (a call, a conditional expression,
    attribute access, statements), that uses TeX programming (`\\catcode`, `\\def`, ...) or a
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
    r"\\(?:lor|vee|bigvee)(?![A-Za-z])|(?<![A-Za-z])(?:or|either|OR)(?![A-Za-z])"
)
# Two values where one is expected (checked only when the gold is one value).
_CONJUNCTION = re.compile(
    r"\\(?:pm|mp|land|wedge)(?![A-Za-z])|(?<![A-Za-z])(?:and|AND)(?![A-Za-z])"
)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")

# Where a final answer without a box starts ("The final answer is", "Answer:").
_CUE = re.compile(r"(?i)\banswer\b\s*(?:\*\*)?\s*(?:is\b|:|=)\s*(?:\*\*)?")
# Code in the clause after the cue: statements, calls, conditionals, attribute access.
_CODE = re.compile(
    r"__|;|`|==|!=|:=|->|\bimport\b|\blambda\b|\bprint\b|\beval\b|\bexec\b"
    r"|\bif\b|\belse\b|\bfor\b|\bwhile\b|\breturn\b|\bdef\b|\bclass\b|\bnot\b"
    r"|(?<![\\A-Za-z])[A-Za-z_][A-Za-z_0-9]+\s*\(|\)\s*\(|\d\s*\(|[\w)\]]\.[A-Za-z_]"
)
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


def answer_reason(answer: str, gold: str) -> str | None:
    """Why an extracted final answer (a box's content) earns nothing, or None."""
    if _DISJUNCTION.search(_text_words(answer)):
        return "several final answers (a disjunction)"
    if "\\mid" in answer and "\\{" not in answer and "\\lbrace" not in answer:
        return "several final answers (\\mid outside a set)"
    if is_single_value(gold):
        if _CONJUNCTION.search(_text_words(answer)) and not _CONJUNCTION.search(gold):
            return "several final answers where the gold is one value"
        if len(top_level_parts(answer)) > 1:
            return "a list of answers where the gold is one value"
    for name in _MACRO.findall(answer):
        if name not in _KNOWN_MACROS:
            return f"unknown TeX macro \\{name} in the final answer"
    return None


def _text_words(answer: str) -> str:
    """`answer` with `\\text{...}`-like wrappers opened, so `\\text{ or }` reads as ` or `."""
    return re.sub(r"\\(?:text|textrm|textbf|textit|mbox|mathrm|operatorname)\s*\{", " {", answer)


def cue_clause(text: str) -> str | None:
    """The clause after the last "answer is" / "Answer:" cue, or None when there is no cue."""
    last = None
    for match in _CUE.finditer(text):
        last = match
    if last is None:
        return None
    rest = text[last.end() : last.end() + _CLAUSE_MAX]
    end = _CLAUSE_END.search(rest)
    return rest[: end.start()] if end else rest


def unboxed_reason(text: str, gold: str) -> str | None:
    """Why a completion without a box earns nothing (code or hedging after its cue), or None."""
    clause = cue_clause(text)
    if clause is None:
        return None
    code = _CODE.search(clause)
    if code:
        return f"code-like final answer ({code.group(0).strip()!r})"
    if _DISJUNCTION.search(_text_words(clause)):
        return "several final answers (a disjunction)"
    if is_single_value(gold) and _CONJUNCTION.search(_text_words(clause)):
        return "several final answers where the gold is one value"
    return None
