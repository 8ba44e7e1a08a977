"""The shape of the tsproxy package: every module imports, no import cycles, no oversized modules.

The import graph is read from the source with ast, so an import counts wherever it is written: at
module level, inside a function (a lazy import) or under `if TYPE_CHECKING:`. Deferring an import
hides a cycle from the interpreter, not from the reader, so those count as cycles too.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tsproxy"
MAX_LINES = 700


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module in the package (a package is its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported(module: str, path: Path) -> set[str]:
    """The tsproxy modules that `module` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                # `from pkg import name` imports the submodule pkg.name when there is one, else pkg.
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    found = set()
    for name in names:
        while name and name not in MODULES:  # `import tsproxy.a.b.c` of a name inside a module
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


CYCLES = _cycles({m: _imported(m, p) for m, p in MODULES.items()})


def test_every_module_imports() -> None:
    for module in MODULES:
        importlib.import_module(module)


def test_the_graph_sees_relative_lazy_and_type_checking_imports() -> None:
    # The test is only as good as its graph: check it on imports of each kind that exist today.
    assert "tsproxy.format.manifest" in _imported("tsproxy.format.tail", MODULES["tsproxy.format.tail"])
    assert "tsproxy.spark.source" in _imported("tsproxy.spark", MODULES["tsproxy.spark"])  # in a function
    assert "tsproxy.errors" in _imported(
        "tsproxy.s3.limits", MODULES["tsproxy.s3.limits"]
    )  # from tsproxy import errors
    assert "tsproxy.store.observe" in _imported("tsproxy.config", MODULES["tsproxy.config"])  # TYPE_CHECKING
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_cycles() -> None:
    assert [sorted(c) for c in CYCLES] == [], "import cycles among tsproxy modules"


def _too_long(module: str) -> bool:
    source = MODULES[module].read_text(encoding="utf-8")
    if source.count("\n") <= MAX_LINES:
        return False
    docstring = ast.get_docstring(ast.parse(source)) or ""
    return not any(line.startswith("Size:") for line in docstring.splitlines())


def test_no_module_exceeds_the_size_limit_without_saying_why() -> None:
    offenders = sorted(m for m in MODULES if _too_long(m))
    assert offenders == [], f"over {MAX_LINES} lines with no 'Size:' line in the docstring: {offenders}"
