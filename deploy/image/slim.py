"""Trim a virtualenv for the container image: what tsproxy never loads does not ship.

    python slim.py /opt/tsproxy

Run by the Dockerfile's build stage after the dependencies are installed; prints what it saved.

* Test suites, C/C++ and Cython sources and headers of the installed packages.
* pyarrow's Flight RPC and S3 filesystem libraries (tsproxy writes S3 through boto3, never Flight), and
  its C++ test module. pyarrow.fs imports without them (S3FileSystem is then simply absent).
* Identical copies of a versioned shared library (libX.so, libX.so.N, libX.so.N.M, as wheels ship
  them) become symlinks to one file.
* Symbol tables of shared libraries (`strip --strip-unneeded`, as Debian's packages are).
* In Spark's jars, native libraries built for another OS, another CPU or musl: each jar keeps only
  the ones this machine would load.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

SOURCE_SUFFIXES = (".pyx", ".pxd", ".pxi", ".h", ".hpp", ".cc", ".cpp", ".c")
PYARROW_UNUSED = re.compile(
    r"^(libarrow_flight|libarrow_python_flight|_flight\.|libarrow_s3|_s3fs\.|_pyarrow_cpp_tests)"
)
NATIVE = re.compile(r"\.(so|dll|dylib|jnilib|a)$|(^|/)native/", re.IGNORECASE)
OTHER_OS = re.compile(r"(?<![a-z])(?:win|osx|darwin|mac|freebsd|aix|sunos|solaris)|musl", re.IGNORECASE)
# How the jars name this machine's CPU (x86_64: amd64, x86_64, linux64; arm64: aarch64, aarch_64).
ARCH_NAMES = {
    "x86_64": re.compile(r"amd64|x86[-_]64|linux64(?![-_]?musl)", re.IGNORECASE),
    "aarch64": re.compile(r"aarch_?64|arm64", re.IGNORECASE),
}


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def remove(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        size = path.lstat().st_size
        path.unlink()
        return size
    if path.is_dir():
        size = sum(p.lstat().st_size for p in path.rglob("*"))
        shutil.rmtree(path)
        return size
    return 0


def drop_sources_and_tests(site: Path) -> int:
    saved = 0
    for path in sorted(site.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        relative = path.relative_to(site)
        in_package = len(relative.parts) >= 2 and not relative.parts[0].endswith(".dist-info")
        if path.is_dir() and not path.is_symlink() and in_package and path.name == "tests":
            saved += remove(path)
        elif path.is_file() and in_package and path.suffix in SOURCE_SUFFIXES:
            saved += remove(path)
    for include in (site / "pyarrow" / "include", site / "pyarrow" / "src"):
        saved += remove(include)
    return saved


def drop_unused_pyarrow(site: Path) -> int:
    pyarrow = site / "pyarrow"
    if not pyarrow.is_dir():
        return 0
    return sum(remove(p) for p in pyarrow.iterdir() if PYARROW_UNUSED.match(p.name))


def link_library_copies(site: Path) -> int:
    """libX.so.N.M, libX.so.N and libX.so with the same bytes: keep the longest name, link the others."""
    saved = 0
    groups: dict[tuple[Path, str], list[Path]] = {}
    for path in site.rglob("*.so*"):
        match = re.match(r"^(.*?\.so)(\.[0-9.]+)?$", path.name)
        if match and path.is_file() and not path.is_symlink():
            groups.setdefault((path.parent, match.group(1)), []).append(path)
    for paths in groups.values():
        if len(paths) < 2:
            continue
        paths.sort(key=lambda p: len(p.name), reverse=True)
        keep = paths[0]
        digest = hashlib.sha256(keep.read_bytes()).digest()
        for other in paths[1:]:
            if hashlib.sha256(other.read_bytes()).digest() == digest:
                saved += remove(other)
                other.symlink_to(keep.name)
    return saved


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def strip_libraries(venv: Path) -> int:
    strip = shutil.which("strip")
    if strip is None:
        print("slim: no strip (binutils): shared libraries keep their symbols", file=sys.stderr)
        return 0
    saved = 0
    for path in venv.rglob("*.so*"):
        if path.is_file() and not path.is_symlink() and is_elf(path):
            before = path.stat().st_size
            subprocess.run([strip, "--strip-unneeded", str(path)], check=True)
            saved += before - path.stat().st_size
    return saved


def foreign(jar: str, name: str, arch: re.Pattern[str]) -> bool:
    """A native library in a jar that this machine (Linux, glibc, this CPU) would never load (a jar
    named for one platform, such as netty's, names it in the jar's name rather than the entry's)."""
    if not NATIVE.search(name) or name.endswith("/"):
        return False
    where = f"{jar}!{name}"
    return bool(OTHER_OS.search(where)) or not arch.search(where)


def thin_jars(site: Path) -> int:
    arch = ARCH_NAMES.get(platform.machine())
    jars = site / "pyspark" / "jars"
    if arch is None or not jars.is_dir():
        return 0
    saved = 0
    for jar in sorted(jars.glob("*.jar")):
        with zipfile.ZipFile(jar) as source:
            drop = [i for i in source.infolist() if foreign(jar.name, i.filename, arch)]
            if not drop:
                continue
            before = jar.stat().st_size
            thinner = jar.with_suffix(".thin")
            with zipfile.ZipFile(thinner, "w") as out:
                for info in source.infolist():
                    if info not in drop:
                        out.writestr(info, source.read(info), compress_type=info.compress_type)
        os.replace(thinner, jar)
        saved += before - jar.stat().st_size
    return saved


def main(argv: list[str]) -> int:
    venv = Path(argv[1])
    site = site_packages(venv)
    steps = [
        ("tests and sources", drop_sources_and_tests(site)),
        ("pyarrow flight and s3", drop_unused_pyarrow(site)),
        ("library copies", link_library_copies(site)),
        ("symbols", strip_libraries(venv)),
        ("foreign natives in jars", thin_jars(site)),
    ]
    for what, saved in steps:
        print(f"slim: {what}: {saved / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
