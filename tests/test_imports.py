"""Every module of the package imports on its own, and the package's import graph has no cycle.

The graph counts every `import`/`from ... import` of a `dynamo_jax` module anywhere in a file,
function-local ones included (they are cycles deferred to run time, not removed). Package
`__init__` files only re-export, so they are not nodes of their own.
"""

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dynamo_jax"


def _modules() -> dict[str, Path]:
    root = PACKAGE.parent
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        package = module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = _target(name) if name.startswith("dynamo_jax") else None
                if target and target != module and MODULES[target].name != "__init__.py":
                    edges[module].add(target)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.endswith("__main__")))
def test_every_module_imports(module):
    importlib.import_module(module)


def _test_module_imports(source: str) -> list[str]:
    """The test modules (`test_*`, `tests.test_*`) a file imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        found += [n for n in names if n.split(".")[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another():
    """Shared test code lives in tests/helpers/ (or a non-test module beside them): importing a
    test module would run its module-level setup and collect its tests twice."""
    tests = Path(__file__).resolve().parent
    found = {
        path.name: imports
        for path in sorted(tests.rglob("*.py"))
        if (imports := _test_module_imports(path.read_text()))
    }
    assert found == {}
    assert _test_module_imports("from test_a import x\nimport tests.test_b\nimport helpers") == [
        "test_a",
        "tests.test_b",
    ]


def test_a_synthetic_run_loads_no_library_it_does_not_use():
    """The tiny run's start (loop, tasks, the synthetic checker, the plots module) loads neither
    torch, matplotlib (plots are drawn at the end), nor SymPy and math-verify (the math tasks'
    scorer); tensorboardX's own ask for torch is tests/test_reporting_metrics.py's."""
    from helpers.scripts import python_snippet

    code = (
        "import sys\n"
        "import dynamo_jax.loop.train, dynamo_jax.tasks, dynamo_jax.reporting.plots\n"
        "from dynamo_jax.data.synthetic import SyntheticScorer\n"
        "from dynamo_jax.rewards import RewardConfig\n"
        "print(SyntheticScorer(RewardConfig()).score(['3'], ['3'])[0].status)\n"
        "print(sorted(m for m in ('torch', 'matplotlib', 'sympy', 'math_verify') "
        "if m in sys.modules))\n"
    )
    out = python_snippet(code)
    assert out.split("\n")[:2] == ["correct", "[]"], out


def test_the_rewards_package_still_gives_its_scorer_and_pool_by_name():
    import dynamo_jax.rewards as rewards
    from dynamo_jax.rewards.math_check import score_one
    from dynamo_jax.rewards.scorer import RewardPool

    assert rewards.score_one is score_one and rewards.RewardPool is RewardPool
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        rewards.missing  # noqa: B018
