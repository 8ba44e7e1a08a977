"""Every file the documentation and the deploy examples name exists: a path in prose or a comment
(`deploy/kubernetes/base/services.yaml`), and every relative Markdown link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Text a reader follows: the docs, the deploy examples and their comments, the code's docstrings.
SOURCES = sorted(
    p
    for pattern in (
        "README.md",
        "CHANGELOG.md",
        "Dockerfile",
        "Makefile",
        "docs/*.md",
        "deploy/**/*",
        "benchmarks/**/*",
        "tsproxy/**/*.py",
    )
    for p in ROOT.glob(pattern)
    if p.is_file() and p.suffix not in (".json", ".pyc")
)
REPO_PATH = re.compile(r"(?<![\w/.-])((?:deploy|docs|benchmarks|tests|tsproxy)/[\w./-]*\w)")
MD_LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")


def _references(path: Path) -> list[tuple[str, Path]]:
    text = path.read_text(errors="replace")
    found = [(m.group(1), ROOT / m.group(1)) for m in REPO_PATH.finditer(text)]
    if path.suffix == ".md":
        found += [(m.group(1), path.parent / m.group(1)) for m in MD_LINK.finditer(text)]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_file_exists(path: Path) -> None:
    missing = [name for name, target in _references(path) if not target.exists()]
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist: {missing}"


def test_the_references_are_found() -> None:
    """The scan itself: it sees the path in prometheus.yml's comment that once named a missing file."""
    names = [name for name, _ in _references(ROOT / "deploy" / "prometheus" / "prometheus.yml")]
    assert "deploy/kubernetes/base/services.yaml" in names
