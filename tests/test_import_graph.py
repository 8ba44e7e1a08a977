"""The shape of the tsproxy package: every module imports, each room imports only what
docs/ARCHITECTURE.md's "may import" column allows, no import cycles, no oversized modules.

The import graph is read from the source with ast, so an import counts wherever it is written: at
module level, inside a function (a lazy import) or under `if TYPE_CHECKING:`. Deferring an import
hides a cycle from the interpreter, not from the reader, so those count as cycles too.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tsproxy"
MAX_LINES = 700
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


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


# -- the rooms of docs/ARCHITECTURE.md and what each may import ------------------------------------------


def room_of(module: str) -> str:
    """The room of a module: its package below tsproxy (`tsproxy.service.uploads.ids` -> service), a
    top-level module's own name (`tsproxy.config` -> config), or `tsproxy` for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tsproxy"


def _allowed() -> dict[str, set[str]]:
    """Room -> the rooms it may import, from the first table of docs/ARCHITECTURE.md."""
    allowed: dict[str, set[str]] = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or not cells[0].startswith("`"):
            continue
        rooms = [name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", cells[0])]
        may = set() if cells[2] == "nothing" else {r.strip() for r in cells[2].split(",")}
        for room in rooms:
            allowed[room] = may
    return allowed


ALLOWED = _allowed()


def test_the_map_names_every_room() -> None:
    rooms = {room_of(m) for m in MODULES} - {"tsproxy"}
    assert rooms - set(ALLOWED) == set(), "rooms missing from docs/ARCHITECTURE.md's table"
    assert set(ALLOWED) - rooms == set(), "rooms in docs/ARCHITECTURE.md's table that the code has not"
    named = set().union(*ALLOWED.values())
    assert named - rooms - {"tsproxy"} == set(), "a 'may import' cell names no room"


def test_each_room_imports_only_what_the_map_allows() -> None:
    unexpected = sorted(
        f"{m} imports {t}"
        for m, p in MODULES.items()
        if room_of(m) != "tsproxy"
        for t in _imported(m, p)
        if room_of(t) != room_of(m) and room_of(t) not in ALLOWED[room_of(m)]
    )
    assert unexpected == [], "imports docs/ARCHITECTURE.md does not allow (change the code or the map)"


def test_the_map_check_sees_a_forbidden_import() -> None:
    # The check is only as good as its reading of the table: a lower room importing a higher one fails.
    assert "server" not in ALLOWED["store"] and "service" not in ALLOWED["cache"]
    assert room_of("tsproxy.service.uploads.ids") == "service" and room_of("tsproxy.config") == "config"
