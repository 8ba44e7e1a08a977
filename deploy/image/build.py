"""Build tsproxy's container images without a container engine: buildah, from a Debian base made here.

    python3 deploy/image/build.py base                 # make the Debian base once (prints its name)
    python3 deploy/image/build.py build --extras fast  # one image (see --help)
    python3 deploy/image/build.py all                  # both: what `make image` runs

Where Docker is at hand, `docker build` on the repository's Dockerfile gives the same images on
python:3.11-slim (README, Install). Here the base stands in for python:3.11-slim: `debootstrap
--variant=minbase` of Debian bookworm (whose python3 is 3.11) from the mirror apt uses, with python3,
python3-venv, python-is-python3 and ca-certificates, committed into buildah's own storage under a name
keyed by this recipe, so it is made once and every later build reuses it.

Behind a TLS-intercepting proxy, pip in the build must trust the proxy's CA: the host's CA bundle goes to
the Dockerfile's RUN steps that fetch as the build secret `ca` (never into a layer). It is the bundle
pip is configured with here (PIP_CERT, /etc/pip.conf), else the system bundle; `--ca none` turns it off.

Standard library only, so that it runs before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_REPO = "localhost/tsproxy-base"
TOOLS = {"buildah": "buildah", "debootstrap": "debootstrap"}
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The two images `make image` builds: the server, and the server with the data pipeline and Java.
IMAGES = {"fast": "tsproxy", "fast,spark": "tsproxy-pipeline"}


def version() -> str:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if match is None:
        raise SystemExit("pyproject.toml has no version")
    return match.group(1)


def image_name(extras: str) -> str:
    """The name and tag the build gives the image with these extras (deploy/kubernetes uses them)."""
    repo = IMAGES.get(extras, "tsproxy-" + extras.replace(",", "-"))
    return f"localhost/{repo}:{version()}"


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, **kwargs)


def ensure_tools() -> None:
    """Install buildah and debootstrap from Debian's packages when they are missing."""
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise SystemExit(f"missing {', '.join(missing)} and no apt-get to install them")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing {' '.join(missing)}", file=sys.stderr)
    _run([*sudo, "apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
    _run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
         stdout=subprocess.DEVNULL)  # fmt: skip


def mirror() -> str:
    """The Debian mirror apt is configured with here (deb822 or one-line sources), else deb.debian.org."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for stanza in path.read_text(encoding="utf-8", errors="replace").split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
            )
            suites = fields.get("Suites", "").split()
            if SUITE in suites and "debian-security" not in fields.get("URIs", ""):
                return fields.get("URIs", "").split()[0].strip()
    one_line = Path("/etc/apt/sources.list")
    if one_line.is_file():
        for line in one_line.read_text(encoding="utf-8", errors="replace").splitlines():
            words = [w for w in line.split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                return words[1]
    return DEFAULT_MIRROR


def base_name() -> str:
    """The base's name: the recipe's hash in the tag, so a changed recipe makes a new base."""
    recipe = json.dumps({"suite": SUITE, "packages": BASE_PACKAGES, "variant": "minbase", "rev": 1})
    return f"{BASE_REPO}:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def exists(image: str) -> bool:
    found = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True)
    return found.returncode == 0


def make_base() -> str:
    """The Debian base in buildah's storage, made once (debootstrap) and reused after."""
    ensure_tools()
    name = base_name()
    if exists(name):
        return name
    started = time.monotonic()
    container = _run(["buildah", "from", "scratch"], capture_output=True).stdout.strip()
    try:
        root = Path(_run(["buildah", "mount", container], capture_output=True).stdout.strip())
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES), SUITE, str(root),
              mirror()], stdout=subprocess.DEVNULL)  # fmt: skip
        # What a slim base leaves out: package lists and archives, logs, docs and manuals.
        for junk in ("var/lib/apt/lists", "var/cache/apt", "var/log", "usr/share/doc", "usr/share/man",
                     "usr/share/info", "usr/share/locale"):  # fmt: skip
            path = root / junk
            if path.is_dir():
                for child in path.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        _run(["buildah", "umount", container], stdout=subprocess.DEVNULL)
        _run(["buildah", "config", "--env", "LANG=C.UTF-8",
              "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--cmd", "python3", container])  # fmt: skip
        _run(["buildah", "commit", "--quiet", "--rm", container, name], stdout=subprocess.DEVNULL)
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True)
        raise
    print(f"made {name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return name


def ca_bundle(choice: str | None) -> Path | None:
    """The CA bundle to hand the build as its `ca` secret: given, pip's, or the system's."""
    if choice == "none":
        return None
    if choice:
        return Path(choice)
    candidates = [os.environ.get("PIP_CERT")]
    pip_conf = configparser.ConfigParser()
    pip_conf.read(["/etc/pip.conf", Path.home() / ".config/pip/pip.conf", Path.home() / ".pip/pip.conf"])
    candidates.append(pip_conf.get("global", "cert", fallback=None))
    candidates.append(os.environ.get("SSL_CERT_FILE"))
    candidates.append(str(SYSTEM_BUNDLE))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build(extras: str, tag: str | None = None, ca: str | None = None, base: str | None = None) -> str:
    """Build the image with these extras from the Dockerfile (layers cached by buildah); its name."""
    base = base or make_base()
    tag = tag or image_name(extras)
    argv = ["buildah", "bud", "--isolation", "chroot", "--layers", "--format", "docker",
            "--build-arg", f"BASE={base}", "--build-arg", f"EXTRAS={extras}", "--tag", tag]  # fmt: skip
    bundle = ca_bundle(ca)
    if bundle is not None:
        argv += ["--secret", f"id=ca,src={bundle}"]
    started = time.monotonic()
    _run([*argv, "--file", str(REPO / "Dockerfile"), str(REPO)])
    print(f"built {tag} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return tag


def size(image: str) -> int:
    """The image's size in bytes: its layers unpacked, as buildah's storage records them."""
    info = json.loads(_run(["buildah", "info"], capture_output=True).stdout)["store"]
    root, driver = Path(info["GraphRoot"]), info["GraphDriverName"]
    layers = {layer["id"]: layer for layer in json.loads((root / f"{driver}-layers/layers.json").read_text())}
    image_id = _run(["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
                    capture_output=True).stdout.strip()  # fmt: skip
    images = json.loads((root / f"{driver}-images/images.json").read_text())
    (top,) = [i["layer"] for i in images if i["id"] == image_id]
    total = 0
    while top:
        total += int(layers[top].get("diff-size", 0))
        top = layers[top].get("parent", "")
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("base", help="make the Debian base once and print its name")
    one = sub.add_parser("build", help="build one image")
    one.add_argument("--extras", default="fast", help="tsproxy's extras (default fast; fast,spark: pipeline)")
    one.add_argument("--tag", help="image name (default: localhost/tsproxy[-pipeline]:VERSION)")
    one.add_argument("--ca", help="CA bundle for the build's fetches (default: pip's or the system's; none)")
    both = sub.add_parser("all", help="build the server and the pipeline image")
    both.add_argument("--ca", help="as for build")
    args = parser.parse_args(argv)
    if args.command == "base":
        print(make_base())
        return 0
    base = make_base()
    todo = [args.extras] if args.command == "build" else list(IMAGES)
    built = [build(extras, getattr(args, "tag", None), args.ca, base) for extras in todo]
    base_size = size(base)
    print(f"{'image':<40} {'MB':>8} {'added MB':>9}")
    print(f"{base:<40} {base_size / 1e6:8.0f} {'':>9}")
    for name in built:
        total = size(name)
        print(f"{name:<40} {total / 1e6:8.0f} {(total - base_size) / 1e6:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
