"""The package layering and the size limits of product code, checked on the source.

Layers, lowest first: estimators < controller < actuators < simulator < service. A module
may import its own layer and the ones below, never one above (docs/ARCHITECTURE.md,
"Layers"). `governor_api` (generated gRPC stubs) sits below all of them and imports none;
so does `governor_engine` (the plugin loaded inside vLLM: it imports only governor_api).
The check walks the AST of every product module: `import x`, `from x import y` (also
inside functions) and `importlib.import_module("x")` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("estimators", "controller", "actuators", "simulator", "service")
RANK = {name: i for i, name in enumerate(LAYERS)} | {"governor_api": -1, "governor_engine": -1}
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 80
# Files allowed past MAX_FILE_LINES, each with its reason.
FILE_LENGTH_ALLOWED: dict[str, str] = {}
# Packages whose functions are held to MAX_FUNCTION_LINES by this test.
FUNCTION_LIMITED = (
    "estimators",
    "controller",
    "actuators",
    "simulator",
    "service",
    "governor_engine",
)
# Files whose functions may pass MAX_FUNCTION_LINES, each with its reason.
FUNCTION_LENGTH_ALLOWED = {
    "simulator/engine.py": "the simulated engine's step loop is one hot path, kept together",
}


def product_files() -> list[Path]:
    files = [
        p
        for pkg in (*LAYERS, "governor_api", "governor_engine")
        for p in (ROOT / pkg).rglob("*.py")
    ]
    assert len(files) > 40, "the product packages were not found"
    return sorted(files)


def imported_packages(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value.split(".")[0]


def layer_violations(path: Path, source: str) -> list[str]:
    """`path:line imports pkg (layer above)` for each import pointing up a layer."""
    rel = path.relative_to(ROOT)
    own = RANK[rel.parts[0]]
    return [
        f"{rel}:{line}: {rel.parts[0]} imports {pkg}, a layer above it"
        for line, pkg in imported_packages(ast.parse(source))
        if pkg in RANK and RANK[pkg] > own
    ]


def test_no_import_points_up_a_layer() -> None:
    problems = [v for p in product_files() for v in layer_violations(p, p.read_text())]
    assert not problems, "\n".join(problems)


def test_layer_check_catches_each_kind_of_import() -> None:
    """The checker itself: each form of an upward import is reported."""
    path = ROOT / "controller" / "example.py"
    for source in (
        "import service.core\n",
        "from actuators.publisher import DecisionBoard\n",
        "def f():\n    from simulator import fleet\n",
        "import importlib\nimportlib.import_module('simulator.cli')\n",
    ):
        assert layer_violations(path, source), source
    assert not layer_violations(path, "from estimators.types import Observation\n")
    assert not layer_violations(ROOT / "service" / "x.py", "import simulator.cli\n")


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_length(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    if rel.startswith("governor_api/") or rel in FILE_LENGTH_ALLOWED:
        return
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, (
        f"{rel} has {lines} lines (limit {MAX_FILE_LINES}): split it by responsibility"
    )


def test_allowed_long_files_exist() -> None:
    """An allow-list entry for a file that no longer exists (or got short) must go."""
    for rel in FILE_LENGTH_ALLOWED:
        assert (ROOT / rel).is_file(), rel
        assert len((ROOT / rel).read_text().splitlines()) > MAX_FILE_LINES, (
            f"{rel} is within the limit now: remove it from FILE_LENGTH_ALLOWED"
        )


def test_function_length_in_service() -> None:
    problems = []
    for pkg in FUNCTION_LIMITED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if str(path.relative_to(ROOT)) in FUNCTION_LENGTH_ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        problems.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert not problems, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(problems)
