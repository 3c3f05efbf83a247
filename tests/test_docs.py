"""The project's docs hold together: every `docs/<page>.md#<anchor>` citation in code, configs,
tests, benchmarks and docs names a heading that exists (GitHub's anchor rules), every relative
Markdown link names a file inside the repository, nothing cites a specification that a clone
does not have (docs/design.md#tests), every backticked project name in docs/ resolves to a file,
a config field or a definition (the rules are above `code_name_problems`), and every formula
labelled as DynaMO's or E3's cites an equation number."""

from __future__ import annotations

import importlib
import importlib.util
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


# --- Code names in docs/ ------------------------------------------------------------------------
#
# Which backticked strings of docs/*.md are checked (outside fenced blocks; a trailing
# `= value` / `=value` is dropped first, so `train.packing=True` is the key `train.packing`):
#
# - a path ending in `.py` (optionally `::test_name`): a project file. With a '/', its first
#   part must be a top-level directory of the repository or a package under dynamo_jax/ (other
#   paths, such as the authors' `verl/...`, are theirs and not checked); it must exist under the
#   repository root or dynamo_jax/, and `::name` must be a `def` in it. Without a '/', some
#   file of that name must exist in the repository.
# - a dotted name `a.b[.c...]` of identifiers whose last part is not a file suffix
#   (`config.json`, `metrics.jsonl`, `model.safetensors`):
#   - `section.field` where `section` is a config section (`dynamo_jax.config.SECTIONS`) and
#     `field` one of its keys (`dynamo_jax.config.section_fields`: its dataclass's init fields, or
#     for the loss section also every loss variant's own keys): a config key, complete as it is;
#   - otherwise, when `a` is `dynamo_jax`, a module of the package by its last name (`rl_step`,
#     `losses`, `planner`) or a class the package defines (`RunConfig`, `RowLayout`): a code
#     name, which must import and resolve attribute by attribute (a dataclass field or an
#     annotation counts as a class attribute);
#   - otherwise, when `a` is a config section: an error (neither a key nor code);
#   - otherwise, when `a` is a module of the environment (jax, os, wandb, ...) or in
#     OTHER_PROJECTS: another library's name, not checked;
#   - otherwise: an error (a name of nothing, such as a module that was renamed away).
# - metric names (`time/update`, `rollout/staleness`) have a '/' and no `.py`: not checked.
#
# GGUF metadata keys share their first word with a module (models/tokenizer.py): not code.
FOREIGN_PREFIXES = ("tokenizer.ggml.",)
# First names of other projects' code that the trainer's environment does not install.
OTHER_PROJECTS = {
    "vllm",  # the sidecar's own environment
    "dynamo_ray_trainer",  # the DynaMO authors' trainer module
    "algorithm",  # verl's config section
    "HfApi",  # huggingface_hub's client class
}
PLACEHOLDERS = {"module.function"}  # docs/algorithm.md's statement of the convention
FILE_SUFFIXES = {
    *("json", "jsonl", "safetensors", "gguf", "log", "lock"),
    *("md", "toml", "sh", "txt", "png"),
}
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PY_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.py(?:::(\w+))?")
PACKAGE = ROOT / "dynamo_jax"


def doc_spans(md: Path) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced blocks."""
    out, in_fence = [], False
    for lineno, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.extend((lineno, span) for span in CODE_SPAN.findall(line))
    return out


def _modules() -> dict[str, list[str]]:
    """Last name → the dotted module names under dynamo_jax/ that end in it."""
    names: dict[str, list[str]] = {"dynamo_jax": ["dynamo_jax"]}
    for py in sorted(PACKAGE.rglob("*.py")):
        parts = py.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.setdefault(parts[-1], []).append(".".join(parts))
    return names


def _classes() -> dict[str, list[str]]:
    """Class name → the modules under dynamo_jax/ that define it (a `class X` at line start)."""
    out: dict[str, list[str]] = {}
    for py in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(py.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for name in re.findall(r"^class (\w+)", py.read_text(encoding="utf-8"), re.M):
            out.setdefault(name, []).append(module)
    return out


def _has(obj, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if isinstance(obj, type):
        fields = getattr(obj, "__dataclass_fields__", {})
        annotations = {k for c in obj.__mro__ for k in getattr(c, "__annotations__", {})}
        return name in fields or name in annotations
    return False


def _resolve_from(module: str, rest: list[str]) -> bool:
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for i, part in enumerate(rest):
        if not _has(obj, part):
            try:  # a submodule not imported by its package
                obj = importlib.import_module(".".join([module, *rest[: i + 1]]))
                continue
            except ImportError:
                return False
        obj = getattr(obj, part, None)
        if obj is None:  # a dataclass field or annotation without a class-level value
            return i == len(rest) - 1
    return True


def _project_file(root: Path, path: str) -> Path | None:
    for base in (root, root / "dynamo_jax"):
        if (base / path).is_file():
            return base / path
    return None


def code_name_problems(root: Path, md_files: list[Path]) -> tuple[list[str], int]:
    """(one line per backticked project name in `md_files` that does not resolve; how many were
    checked). The rules are in the comment above."""
    from dynamo_jax.config import SECTIONS, section_fields

    modules, classes = _modules(), _classes()
    top_dirs = {p.name for p in root.iterdir() if p.is_dir()} | set(modules)
    file_names = {p.name for p in text_files(root) if p.suffix == ".py"}
    found: list[str] = []
    checked = 0
    for md in md_files:
        for lineno, span in doc_spans(md):
            page = md.relative_to(root).as_posix() if md.is_relative_to(root) else md.name
            where = f"{page}:{lineno}: `{span}`"
            name = re.sub(r"\s*=.*$", "", span) if DOTTED.match(span) else span
            path = PY_PATH.fullmatch(name)
            if path:
                file_part, _, test = name.partition("::")
                if "/" in file_part:
                    if file_part.split("/")[0] not in top_dirs:
                        continue
                    checked += 1
                    target = _project_file(root, file_part)
                    if target is None:
                        found.append(f"{where}: no such file")
                    elif test and not re.search(rf"^def {test}\(", target.read_text(), re.M):
                        found.append(f"{where}: no def {test} in {file_part}")
                else:
                    checked += 1
                    if file_part not in file_names:
                        found.append(f"{where}: no file of that name")
                continue
            if (
                not DOTTED.fullmatch(name)
                or name.startswith(FOREIGN_PREFIXES)
                or name in PLACEHOLDERS
            ):
                continue
            parts = name.split(".")
            if parts[-1] in FILE_SUFFIXES:
                continue
            section = SECTIONS.get(parts[0])
            if section is not None and len(parts) == 2:
                if parts[1] in section_fields(parts[0]):
                    checked += 1
                    continue
            if parts[0] in modules or parts[0] in classes:
                checked += 1
                candidates = [(m, parts[1:]) for m in modules.get(parts[0], [])]
                candidates += [(m, parts) for m in classes.get(parts[0], [])]
                if not any(_resolve_from(m, rest) for m, rest in candidates):
                    found.append(f"{where}: does not resolve in dynamo_jax")
            elif section is not None:
                checked += 1
                found.append(f"{where}: neither a config key nor a name in dynamo_jax")
            elif parts[0] not in OTHER_PROJECTS and importlib.util.find_spec(parts[0]) is None:
                checked += 1
                found.append(f"{where}: names no module of dynamo_jax or of the environment")
    return found, checked


def test_the_code_name_checker_finds_what_is_broken(tmp_path):
    md = tmp_path / "page.md"
    md.write_text(
        "`generate.generate` `rollouts.resample` `loop.generate.no_such` `dynamo_jax.loop.rl_step`\n"
        "`train.steps` `train.packing=True` `loss.no_such_key` `RunConfig.budget` `RunConfig.nope`\n"
        "`losses/variants.py` `losses/nope.py` `tests/test_docs.py::test_github_anchor`\n"
        "`tests/test_docs.py::test_nope` `variants.py` `nope.py`\n"
        "not checked: `verl/utils/x.py` `jax.numpy.nope` `metrics.jsonl` `tokenizer.ggml.pre`\n"
        "`time/update` `module.function` `vllm.LLM` `a b.c`\n"
        "```\n`rollouts.fenced`\n```\n"
    )
    found, checked = code_name_problems(ROOT, [md])
    text = "\n".join(found)
    assert "`rollouts.resample`: names no module of dynamo_jax or of the environment" in text
    assert "`loop.generate.no_such`: does not resolve in dynamo_jax" in text
    assert "`loss.no_such_key`: neither a config key nor a name in dynamo_jax" in text
    assert "`RunConfig.nope`: does not resolve" in text
    assert "`losses/nope.py`: no such file" in text
    assert "`tests/test_docs.py::test_nope`: no def test_nope in tests/test_docs.py" in text
    assert "`nope.py`: no file of that name" in text
    assert len(found) == 7, found
    assert checked == 15, checked


def test_every_code_name_in_the_docs_resolves():
    found, checked = code_name_problems(ROOT, sorted((ROOT / "docs").glob("*.md")))
    assert not found, "\n".join(found)
    # docs/algorithm.md alone names some hundred functions: a handful means the scan is broken.
    assert checked > 200, checked


# --- Formulas labelled as the papers' -----------------------------------------------------------
#
# A formula is an indented block (four spaces, after a blank line, outside fences and lists) of
# a docs/ page. It is labelled as one of the two papers the project implements when the
# paragraph that introduces it cites DynaMO or E3: `(DynaMO)`, `(DynaMO, ...)`, `(DynaMO Eq. ...)`
# (or Alg., Appendix, Table, Section) or `DynaMO Eq. ...`, the same for E3; a parenthesis that
# merely mentions a paper, "(E3 changes T every step)", is no label. The label must hold an
# equation number (`Eq. 27`; "Eq. 27/29" names no one equation). A formula the paper prints
# without a number is introduced without such a label (docs/algorithm.md's preamble).
PAPER_LABEL = re.compile(
    r"\((?:DynaMO|E3)(?:,[^)]*|\s+(?:Eq|Alg|Appendix|Table|Section|§)[^)]*)?\)"
    r"|\b(?:DynaMO|E3) Eq\.[^,;:)]*"
)
EQ_NUMBER = re.compile(r"\bEq\. \d+(?![/\d])")


def paper_formulas(md: Path) -> list[tuple[int, list[str]]]:
    """(line of the formula, the paper labels of its introducing paragraph) for every formula."""
    out: list[tuple[int, list[str]]] = []
    paragraph: list[str] = []
    prev_blank, in_fence, in_block = True, False, False
    for lineno, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
        if in_fence or FENCE.match(line):
            paragraph, prev_blank, in_block = [], False, False
            continue
        if line.startswith("    ") and line.strip() and (prev_blank or in_block):
            if not in_block:
                out.append((lineno, PAPER_LABEL.findall(" ".join(paragraph))))
            in_block = True
        elif not line.strip():
            if not in_block:
                paragraph = [] if prev_blank else paragraph
            prev_blank = True
            continue
        else:
            if in_block or prev_blank:
                paragraph = []
            in_block = False
            paragraph.append(line)
        prev_blank = False
    return out


def formula_label_problems(md_files: list[Path]) -> tuple[list[str], int]:
    """(one line per paper label of a formula without an equation number; formulas labelled)."""
    found, labelled = [], 0
    for md in md_files:
        for lineno, labels in paper_formulas(md):
            labelled += bool(labels)
            for label in labels:
                if not EQ_NUMBER.search(label):
                    found.append(f"{md.name}:{lineno}: labelled {label!r}, no equation number")
    return found, labelled


def test_the_formula_checker_finds_unnumbered_labels(tmp_path):
    md = tmp_path / "page.md"
    md.write_text(
        "# Page\n\nThe change (DynaMO Eq. 27/29):\n\n    x = 1\n\nThe split (E3 Alg. 1):\n\n"
        "    n = 2\n    m = 3\n\nThe priority (DynaMO Eq. 6):\n\n    P = 4\n\n"
        "Unlabelled, (E3 changes T every step):\n\n    z = 5\n\n- a list\n\n"
        "```\n(DynaMO, fenced):\n\n    y = 6\n```\n"
    )
    assert [line for line, _ in paper_formulas(md)] == [5, 9, 14, 18]
    found, labelled = formula_label_problems([md])
    assert found == [
        "page.md:5: labelled '(DynaMO Eq. 27/29)', no equation number",
        "page.md:9: labelled '(E3 Alg. 1)', no equation number",
    ]
    assert labelled == 3


def test_every_paper_formula_cites_an_equation_number():
    found, labelled = formula_label_problems(sorted((ROOT / "docs").glob("*.md")))
    assert not found, "\n".join(found)
    # UMS, the priority, the temperature update and its annealing at least.
    assert labelled >= 4, labelled
