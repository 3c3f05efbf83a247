"""Final-answer extraction and cheap safety bounds, applied before any math parser sees the text.

Model output is untrusted. Everything here is linear-time string scanning with no evaluation,
so it can run on arbitrary input (1 MB strings, 10,000-deep nesting) without risk; the parsers
behind it (math-verify's ANTLR grammar and SymPy) only see answers that passed these bounds.

math-verify's own `parse` takes the first `\\boxed{}` it meets, but a completion that revises
itself ("... \\boxed{3}. Wait, that is wrong ... \\boxed{4}") means the last one, so the last
*closed* box is extracted here first.
"""

from __future__ import annotations

import re

# `\boxed{...}` and `\fbox{...}`; `\boxed 5` (a single-token argument, valid TeX) is also accepted.
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_OPENERS = "{(["
_CLOSERS = "})]"


def _is_escaped(text: str, pos: int) -> bool:
    """True when text[pos] is preceded by an odd number of backslashes (`\\{` is a literal brace)."""
    count = 0
    pos -= 1
    while pos >= 0 and text[pos] == "\\":
        count += 1
        pos -= 1
    return count % 2 == 1


def matching_braces(text: str) -> dict[int, int]:
    """Map the position of every structural `{` to its matching `}` (unclosed ones are absent).

    One left-to-right pass with a stack, so many unclosed boxes cannot make extraction quadratic.
    """
    stack: list[int] = []
    match: dict[int, int] = {}
    for pos, char in enumerate(text):
        if char == "{" and not _is_escaped(text, pos):
            stack.append(pos)
        elif char == "}" and not _is_escaped(text, pos) and stack:
            match[stack.pop()] = pos
    return match


def box_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the content of every closed `\\boxed{...}` / `\\fbox{...}` (and
    `\\boxed X`), in the order the boxes open; unclosed (truncated) boxes are left out.

    Spans, not strings: 10,000 nested boxes would copy quadratically many characters.
    """
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    if not starts:
        return []
    match = matching_braces(text)
    spans = []
    for start in starts:
        pos = start
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text) and text[pos] == "{":
            if pos in match:
                spans.append((pos + 1, match[pos]))
            continue
        # `\boxed 5`: TeX takes a single token; take the run up to whitespace or `$`.
        if pos > start:
            token = re.compile(r"[^\s$]+").match(text, pos)
            if token:
                spans.append((pos, token.end()))
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last closed `\\boxed{...}` / `\\fbox{...}` (or `\\boxed X`), else None."""
    spans = box_spans(text)
    return text[slice(*spans[-1])].strip() if spans else None


def max_nesting_depth(text: str) -> int:
    """Deepest bracket nesting, counting `{`, `(`, `[` alike (intervals like `(1,2]` mix kinds)."""
    depth = deepest = 0
    for char in text:
        if char in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif char in _CLOSERS and depth > 0:
            depth -= 1
    return deepest
