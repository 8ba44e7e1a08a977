"""The reserved namespace's layout has one home: where each key lives, and that no other module spells one."""

from __future__ import annotations

import ast
from pathlib import Path

from tsproxy.service.namespace import Location, Namespace
from tsproxy.service.uploads import layout
from tsproxy.service.uploads.layout import Layout

PACKAGE = Path(__file__).resolve().parents[2] / "tsproxy"
# Pieces of reserved keys: a string holding one spells a key of the reserved namespace.
SPELLINGS = ("mpu/", "mpu-done", "probe-", "catalog/")
RECORD_SUFFIX = ".info"  # a piece of a key when a string ends with it


def test_where_each_key_lives() -> None:
    plain, mapped = Layout(Namespace()), Layout(Namespace("one", "pre/"))
    upload = "tok.YmFja2VuZA.dGlja2V0"  # token, backend upload, ticket: the name drops the ticket
    assert plain.state("b", upload) == Location("b", ".tsproxy/mpu/tok.YmFja2VuZA/state")
    assert plain.record("b", upload, 7) == Location("b", ".tsproxy/mpu/tok.YmFja2VuZA/00007.info")
    data = plain.part_data("b", upload, 7).key
    assert data.startswith(".tsproxy/mpu/tok.YmFja2VuZA/00007-") and len(data.rpartition("-")[2]) == 16
    assert plain.completed("b", "u1") == Location("b", ".tsproxy/mpu-done/u1")
    assert mapped.bucket_marker("bkt") == Location("one", "pre/bkt/.tsproxy/bucket")
    assert mapped.catalog("bkt") == Location("one", "pre/bkt/.tsproxy/catalog/")
    assert mapped.uploads("bkt") == Location("one", "pre/bkt/.tsproxy/mpu/")
    assert mapped.mapped_reserved() == Location("one", "pre/.tsproxy/")
    assert plain.mapped_reserved() is None and layout.probe_name().startswith("probe-")
    assert mapped.is_bucket_marker("pre/b/.tsproxy/bucket") and not plain.is_bucket_marker(".tsproxy/bucket")
    # Read back from listings.
    rest = layout.internal_part("pre/b/.tsproxy/mpu/n/state", "pre/b/")
    assert rest == "mpu/n/state" and layout.upload_folder_of(rest) == "n"
    assert layout.is_state("x/mpu/n/state") and layout.is_record("x/00001.info")
    assert layout.is_probe("probe-0a") and not layout.is_probe("probe-0a/x")


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_other_module_spells_a_reserved_key() -> None:
    spelt = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "service" / "uploads" / "layout.py"
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8")))
        if any(piece in text for piece in SPELLINGS) or text.endswith(RECORD_SUFFIX)
    ]
    assert spelt == []
