"""The package holds tsproxy and nothing beside it, even after `make run` left its data and cache
folders (`tsproxy-data/`, `tsproxy-cache/`, whose names start like the package's) next to the code."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tree_after_make_run(dest: Path) -> Path:
    """A copy of the source tree with what `make run` (its defaults) creates beside the code."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "tsproxy", dest / "tsproxy", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "tsproxy-data" / "demo").mkdir(parents=True)
    (dest / "tsproxy-data" / "demo" / "README.md").write_text("an object\n")
    (dest / "tsproxy-data-dev-keyring.json").write_text("{}\n")
    for shard in ("00", "01", "ff"):
        (dest / "tsproxy-cache" / shard).mkdir(parents=True)
    (dest / "tsproxy-cache" / "00" / "entry.val").write_bytes(b"\0" * 16)
    return dest


def test_the_package_finder_takes_only_tsproxy(tmp_path: Path) -> None:
    """What pyproject.toml's `packages.find` selects, by setuptools' own (namespace) finder."""
    from setuptools import find_namespace_packages

    tree = _tree_after_make_run(tmp_path / "src")
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_namespace_packages(str(tree), include=find["include"])
    assert found and all(p == "tsproxy" or p.startswith("tsproxy.") for p in found), found
    expected = {
        ".".join(d.relative_to(tree).parts)
        for d in (tree / "tsproxy").rglob("*")
        if d.is_dir() and any(d.glob("*.py"))
    } | {"tsproxy"}
    assert expected <= set(found)


@pytest.mark.slow
def test_a_wheel_built_beside_the_data_folders_holds_only_tsproxy(tmp_path: Path) -> None:
    tree = _tree_after_make_run(tmp_path / "src")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tsproxy-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert z.read(top_level).decode().split() == ["tsproxy"]
    assert not [n for n in names if n.startswith("tsproxy-") and ".dist-info/" not in n]
    assert "tsproxy/spark/log4j2.properties" in names
    modules = {str(p.relative_to(tree)) for p in (tree / "tsproxy").rglob("*.py")}
    assert modules <= set(names)
