"""The project's docs hold together: every `docs/<page>.md#<anchor>` citation in code, configs,
tests, benchmarks and docs names a heading that exists (GitHub's anchor rules), every relative
Markdown link names a file inside the repository, and nothing cites a specification that a clone
does not have (docs/design.md#tests)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", ".venv-vllm", ".cache", "workdirs", "build", "dist", "node_modules"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".cfg", ".txt", ".json", ".yaml", ".yml"}
# Split so this file does not match itself.
GONE = ("ALGORITHM" + ".md", "DESIGN" + ".md", "../" + "shared")

CITATION = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md)#([\w-]+)")
MD_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: inline markup dropped, lower case, punctuation other
    than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters of any script, digits and '_'
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeats get GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            base = github_anchor(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def text_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith(".venv") for part in rel.parts[:-1]):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or rel.as_posix() == ".ci/run"):
            files.append(path)
    return files


def _inside(root: Path, target: Path) -> bool:
    try:
        target.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def problems(root: Path) -> tuple[list[str], int]:
    """(one line per broken citation, link or outside reference; how many were checked)."""
    found: list[str] = []
    checked = 0
    cache: dict[Path, set[str]] = {}

    def anchor_ok(md: Path, anchor: str) -> bool:
        if md not in cache:
            cache[md] = anchors(md)
        return anchor in cache[md]

    for path in text_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{lineno}"
            for gone in GONE:
                if gone in line:
                    found.append(f"{where}: refers to {gone!r}, which is not in the repository")
            for page, anchor in CITATION.findall(line):
                checked += 1
                md = root / page
                if not md.is_file():
                    found.append(f"{where}: {page} does not exist")
                elif not anchor_ok(md, anchor):
                    found.append(f"{where}: {page} has no heading with anchor #{anchor}")
            if path.suffix != ".md":
                continue
            for a, b in MD_LINK.findall(line):
                link = a or b
                if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
                    continue
                checked += 1
                target, _, anchor = link.partition("#")
                dest = path if not target else (path.parent / target)
                if not _inside(root, dest):
                    found.append(f"{where}: link {link} points outside the repository")
                elif not dest.exists():
                    found.append(f"{where}: link {link}: no such file")
                elif anchor and dest.suffix == ".md" and not anchor_ok(dest.resolve(), anchor):
                    found.append(f"{where}: link {link}: no heading with that anchor")
    return found, checked


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Water-level allocation", "water-level-allocation"),
        ("The recipe's other heuristic", "the-recipes-other-heuristic"),
        ("`loss_agg_mode` values", "loss_agg_mode-values"),
        ("Exit codes (0, 1, 2)", "exit-codes-0-1-2"),
        ("One step, as data", "one-step-as-data"),
        ("See [the docs](docs/x.md) now", "see-the-docs-now"),
        ("Entropía y más", "entropía-y-más"),
    ],
)
def test_github_anchor(heading, anchor):
    assert github_anchor(heading) == anchor


def test_repeated_headings_get_suffixes(tmp_path):
    md = tmp_path / "a.md"
    md.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n## Notes\n")
    assert anchors(md) == {"a", "notes", "notes-1", "notes-2"}


def test_the_checker_finds_what_is_broken(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page\n## Real heading\n[ok](#real-heading) [bad](#nope) [file](b.md) [up](../../x.md)\n"
        "[web](https://example.com/x.md#y)\n"
    )
    d = "docs/"  # kept apart so the repository scan does not read these as citations
    (tmp_path / "m.py").write_text(
        f'"""See {d}a.md#real-heading and {d}a.md#missing and {d}gone.md#x."""\n# {GONE[0]}\n'
    )
    found, checked = problems(tmp_path)
    text = "\n".join(found)
    assert checked == 7, found
    assert "docs/a.md has no heading with anchor #missing" in text
    assert "docs/gone.md does not exist" in text
    assert "link #nope: no heading with that anchor" in text
    assert "link b.md: no such file" in text
    assert "link ../../x.md points outside the repository" in text
    assert "not in the repository" in text
    assert len(found) == 6, found


def test_every_citation_and_link_resolves():
    found, checked = problems(ROOT)
    assert not found, "\n".join(found)
    # The code cites docs/algorithm.md throughout: a handful of hits means the scan is broken.
    assert checked > 50, checked


def test_algorithm_keeps_the_headings_others_extend():
    assert {"estimators", "water-level-allocation", "temperature-scheduler"} <= anchors(
        ROOT / "docs" / "algorithm.md"
    )
