"""The container images, built from the repository's Dockerfile with buildah, and run.

Made once per module by deploy/image/build.py, the same code `make image` runs: the Debian base
(kept in buildah's storage, reused across runs), the server image (EXTRAS=fast) and the pipeline image
(EXTRAS=fast,spark). The build's CA secret is this machine's CA bundle plus a marker certificate made
for the test, so "no layer holds the secret" is checked against a certificate that is surely in it.

From each image: the entrypoint, run as the image's user on free loopback ports (its --listen flags
overridden by later ones), speaks S3 (PUT, ranged GET, multipart) and answers /healthz, /readyz and
/metrics; the image's own HEALTHCHECK command passes against it and fails once it is gone; after a PUT,
a GET and a restart, nothing changed in the root filesystem but the cache volume, the data directory
and /tmp (what readOnlyRootFilesystem in deploy/kubernetes needs). Every layer's tar is read: no
compiler, no pip or pip cache, no certificate of the secret, files owned as intended. The pipeline
image exports a small tiered bucket to Parquet and verifies the store, with the Java it brings.

Skips only where buildah cannot run here (not root, nothing to install it with); in CI (CI=true) it
fails instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import boto3
import pytest
from botocore.config import Config as BotoConfig
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from deploy_tools import REPO

from tests.spark.kafkadata import PartitionWriter, kafka_uuid, upload_aiven
from tests.support.ports import free_port
from tsproxy.config import Config
from tsproxy.format import KeyRing

pytestmark = pytest.mark.slow

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tsproxy" / "image"
ACCESS_KEY, SECRET_KEY = "image-access", "image-secret-key-0123456789"
MIB = 1 << 20
# Budgets over the base (the goals): MB added by the server and by the pipeline image.
ADDED_MB = {"fast": 120, "fast,spark": 800}
WORKDIR = "/var/lib/tsproxy"
CACHE_VOLUME = f"{WORKDIR}/tsproxy-cache"
DATA_DIR = f"{WORKDIR}/tsproxy-data"
COMPILERS = {"gcc", "cc", "c++", "g++", "clang", "as", "ld", "ld.bfd", "ld.gold", "strip", "javac", "jlink"}


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"the container images cannot be built here, and CI must build them: {reason}")
    pytest.skip(reason)


def _load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tsproxy_image_build", REPO / "deploy/image/build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def buildah(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr[-3000:]}"
    return done.stdout


def _marker_ca() -> bytes:
    """A self-signed CA certificate that exists only to be looked for (kept, so builds stay cached)."""
    path = CACHE / "marker-ca.pem"
    if path.is_file():
        return path.read_bytes()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tsproxy image test marker {uuid.uuid4()}")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path.read_bytes()


@dataclass
class Image:
    extras: str
    name: str
    config: dict[str, Any]
    base_size: int
    size: int
    seconds: float

    @property
    def added_mb(self) -> float:
        return (self.size - self.base_size) / 1e6

    @property
    def user(self) -> str:
        return str(self.config["User"])


@dataclass
class Built:
    base: str
    secret: Path
    images: dict[str, Image] = field(default_factory=dict)


@pytest.fixture(scope="module")
def built() -> Built:
    if os.geteuid() != 0:
        _unavailable("buildah builds and runs images here as root (chroot isolation); this is not root")
    build = _load_build()
    try:
        build.ensure_tools()
    except (subprocess.CalledProcessError, SystemExit, OSError) as e:
        _unavailable(f"buildah and debootstrap are missing and could not be installed: {e}")
    probe = subprocess.run(["buildah", "from", "scratch"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        _unavailable(f"buildah cannot make a container here: {probe.stderr.strip()[-500:]}")
    buildah("rm", probe.stdout.strip())
    base = build.make_base()
    bundle = build.ca_bundle(None)
    CACHE.mkdir(parents=True, exist_ok=True)
    secret = CACHE / "build-ca.pem"
    secret.write_bytes((bundle.read_bytes() if bundle else b"") + b"\n" + _marker_ca())
    out = Built(base, secret)
    for extras in ("fast", "fast,spark"):
        started = time.monotonic()
        name = build.build(extras, ca=str(secret), base=base)
        seconds = time.monotonic() - started
        inspect = json.loads(buildah("inspect", "--type", "image", name))
        out.images[extras] = Image(
            extras, name, inspect["Docker"]["config"], build.size(base), build.size(name), seconds
        )
    for image in out.images.values():
        print(f"{image.name}: {image.size / 1e6:.0f} MB, +{image.added_mb:.0f} MB over {base} "
              f"({image.base_size / 1e6:.0f} MB), built in {image.seconds:.0f} s")  # fmt: skip
    return out


@dataclass
class Layer:
    digest: str
    members: list[tarfile.TarInfo]
    path: Path


@pytest.fixture(scope="module")
def layers(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Layer]]]:
    """Every layer of each image as the tar a registry would get (uncompressed; removed afterwards)."""
    found: dict[str, list[Layer]] = {}
    targets = []
    for extras, image in built.images.items():
        target = tmp_path_factory.mktemp("layers")
        targets.append(target)
        buildah("push", "--quiet", "--disable-compression", image.name, f"dir:{target}")
        manifest = json.loads((target / "manifest.json").read_text())
        found[extras] = []
        for entry in manifest["layers"]:
            path = target / entry["digest"].split(":", 1)[1]
            with tarfile.open(path, "r:*") as tar:
                found[extras].append(Layer(entry["digest"], tar.getmembers(), path))
    yield found
    for target in targets:
        shutil.rmtree(target, ignore_errors=True)


class Box:
    """A working container from an image: run commands in it, see its root filesystem, remove it."""

    def __init__(self, image: Image, mounts: dict[Path, str], volumes: dict[Path, str] | None = None) -> None:
        self.image = image
        self.volumes = volumes or {}
        self.name = f"tsproxy-test-{uuid.uuid4().hex[:10]}"
        buildah("from", "--quiet", "--name", self.name, image.name)
        # The volumes are given here, as the kubelet or `docker run -v` gives them: buildah 1.28 would
        # otherwise pick, run by run, between the image's anonymous volume and a --volume on its path.
        for volume in image.config.get("Volumes") or {}:
            buildah("config", "--volume", f"{volume}-", self.name)
        self.root = Path(buildah("mount", self.name).strip())
        self.mounts = mounts

    def argv(self, command: list[str], env: dict[str, str] | None = None) -> list[str]:
        argv = ["buildah", "run", "--isolation", "chroot", "--user", self.image.user]
        for host, inside in self.mounts.items():
            argv += ["--mount", f"type=bind,src={host},dst={inside},ro"]
        for host, inside in self.volumes.items():
            argv += ["--volume", f"{host}:{inside}"]
        for key, value in (env or {}).items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, self.name, "--", *command]

    def run(self, command: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> Any:
        return subprocess.run(self.argv(command, env), capture_output=True, text=True, timeout=timeout)

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True, timeout=120)


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """What /etc/tsproxy holds in the container (mounted read-only): the config and a key ring, 0440
    owned by root with the image's group, as a Kubernetes Secret volume with fsGroup gives it."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "tsproxy.toml").write_text('key_ring = "/etc/tsproxy/ring.json"\nchunk_size = "256KiB"\n')
    KeyRing.new().save(etc / "ring.json")
    os.chown(etc / "ring.json", 0, 10001)
    os.chmod(etc / "ring.json", 0o440)
    return etc


@dataclass
class Served:
    endpoint: str
    metrics: str
    metrics_port: int
    log: Path

    def s3(self) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=BotoConfig(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _command_of(launcher: int) -> list[int]:
    """The processes a `buildah run` started (its descendants that are not buildah's own helpers)."""
    parents: dict[int, int] = {}
    argv0: dict[int, bytes] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv0[int(proc.name)] = (proc / "cmdline").read_bytes().split(b"\0")[0]
            except (OSError, IndexError, ValueError):
                continue

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == launcher:
                return True
        return False

    return [pid for pid in parents if descends(pid) and not argv0.get(pid, b"").startswith(b"buildah")]


@contextmanager
def serving(box: Box, tmp_path: Path) -> Iterator[Served]:
    """The image's entrypoint with the config, on free loopback ports, until /healthz answers; then
    SIGTERM to tsproxy itself (as the kubelet or `docker stop` sends it), and its exit awaited."""
    port, metrics_port = free_port(), free_port()
    command = [*box.image.config["Entrypoint"], "--config", "/etc/tsproxy/tsproxy.toml",
               "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]  # fmt: skip
    env = {"TSPROXY_ACCESS_KEY": ACCESS_KEY, "TSPROXY_SECRET_KEY": SECRET_KEY}
    log = tmp_path / f"serve-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(box.argv(command, env), stdout=out, stderr=subprocess.STDOUT)
    served = Served(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", metrics_port, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _get(served.metrics + "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"tsproxy in {box.image.name} did not come up:\n{log.read_text()}")
            time.sleep(0.2)
        yield served
    finally:
        for pid in _command_of(process.pid):
            os.kill(pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # Reached only when the block itself passed: then tsproxy must have stopped on its own.
    assert process.returncode == 0, f"tsproxy did not stop cleanly on SIGTERM:\n{log.read_text()[-3000:]}"


def snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every path of a root filesystem: (kind, size, mtime) of files and links; directories by name."""
    found: dict[str, tuple[str, int, int]] = {}
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        if here == root:
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
        for name in dirs:
            found[str((here / name).relative_to(root))] = ("dir", 0, 0)
        for name in files:
            st = (here / name).lstat()
            found[str((here / name).relative_to(root))] = ("file", st.st_size, st.st_mtime_ns)
    return found


def changed(before: dict[str, tuple[str, int, int]], after: dict[str, tuple[str, int, int]]) -> set[str]:
    """Paths added, removed or rewritten (a directory's own mtime moves with its entries: not counted)."""
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def test_image_sizes_stay_within_their_budgets(built: Built) -> None:
    for extras, image in built.images.items():
        assert image.added_mb <= ADDED_MB[extras], (
            f"{image.name} adds {image.added_mb:.0f} MB to its base; the budget is {ADDED_MB[extras]} MB"
        )
        assert image.size > image.base_size  # the sizes are read from buildah's storage, not guessed


@pytest.mark.parametrize("extras", ["fast", "fast,spark"])
def test_entrypoint_serves_s3_and_writes_only_to_cache_data_and_tmp(
    built: Built, extras: str, config_dir: Path, tmp_path: Path
) -> None:
    image = built.images[extras]
    assert image.user == "10001:10001" and image.config["WorkingDir"] == WORKDIR
    # The cache volume as the kubelet or `docker run -v` gives it: a directory the image's user owns.
    volume = tmp_path / "cache-volume"
    volume.mkdir()
    os.chown(volume, 10001, 10001)
    box = Box(image, {config_dir: "/etc/tsproxy"}, {volume: CACHE_VOLUME})
    try:
        # What buildah itself writes when it runs anything (/etc/hosts...) is not tsproxy's doing.
        assert box.run(["true"]).returncode == 0
        settled = snapshot(box.root)
        assert box.run(["true"]).returncode == 0
        own = changed(settled, snapshot(box.root))
        body, parts = os.urandom(3 * MIB + 123), [os.urandom(5 * MIB), os.urandom(MIB + 7)]
        with serving(box, tmp_path) as served:
            s3 = served.s3()
            s3.create_bucket(Bucket="image")
            s3.put_object(Bucket="image", Key="a/segment.log", Body=body)
            ranged = s3.get_object(Bucket="image", Key="a/segment.log", Range="bytes=1000-1999999")
            assert ranged["Body"].read() == body[1000:2000000]
            assert ranged["ContentRange"] == f"bytes 1000-1999999/{len(body)}"
            upload = s3.create_multipart_upload(Bucket="image", Key="a/multi")["UploadId"]
            etags = [
                {"PartNumber": n, "ETag": s3.upload_part(Bucket="image", Key="a/multi", UploadId=upload,
                                                          PartNumber=n, Body=part)["ETag"]}
                for n, part in enumerate(parts, 1)
            ]  # fmt: skip
            s3.complete_multipart_upload(
                Bucket="image", Key="a/multi", UploadId=upload, MultipartUpload={"Parts": etags}
            )
            assert s3.get_object(Bucket="image", Key="a/multi")["Body"].read() == b"".join(parts)
            assert _get(served.metrics + "/healthz")[0] == 200
            assert _get(served.metrics + "/readyz")[0] == 200
            status, metrics = _get(served.metrics + "/metrics")
            assert (
                status == 200 and b'operation="PutObject"' in metrics and b"tsproxy_requests_total" in metrics
            )
            # The image's HEALTHCHECK, its port made this run's.
            check = image.config["Healthcheck"]["Test"]
            assert check[0] == "CMD" and ":9102/healthz" in check[-1]
            probe = [*check[1:-1], check[-1].replace(":9102/", f":{served.metrics_port}/")]
            assert box.run(probe, timeout=60).returncode == 0
        assert box.run(probe, timeout=60).returncode != 0, "the HEALTHCHECK passes with tsproxy gone"
        # A restart: the same data, read back through the key ring and the cache on the volume.
        with serving(box, tmp_path) as served:
            again = served.s3().get_object(Bucket="image", Key="a/segment.log", Range="bytes=0-99")
            assert again["Body"].read() == body[:100]
            assert served.s3().get_object(Bucket="image", Key="a/multi")["Body"].read() == b"".join(parts)
        writes = changed(settled, snapshot(box.root)) - own
        allowed = [p.lstrip("/") for p in (CACHE_VOLUME, DATA_DIR, "/tmp")]
        outside = sorted(p for p in writes if not any(p == a or p.startswith(a + "/") for a in allowed))
        assert outside == [], f"tsproxy wrote outside its cache volume, data directory and /tmp: {outside}"
        # It did write, where the docs say: chunks in the volume, objects in the data directory.
        assert any(p.startswith(allowed[1] + "/") for p in writes), sorted(writes)
        cached = [p for p in volume.rglob("*") if p.is_file()]
        assert cached and all(p.stat().st_uid == 10001 for p in cached), cached
        for line in served.log.read_text().splitlines():
            assert SECRET_KEY not in line
    finally:
        box.remove()


@pytest.mark.parametrize("extras", ["fast", "fast,spark"])
def test_layers_hold_no_compiler_no_pip_no_secret_and_files_are_owned_as_intended(
    built: Built, layers: dict[str, list[Layer]], extras: str
) -> None:
    image = built.images[extras]
    members = [(layer, m) for layer in layers[extras] for m in layer.members]
    names = {_name(m) for _, m in members}
    assert any(n.startswith("opt/tsproxy/bin/tsproxy") for n in names), "the layers were not read"
    compilers = sorted(n for n in names if n.rsplit("/", 1)[-1] in COMPILERS
                       and n.split("/")[0] in ("usr", "opt", "bin") and "/bin/" in "/" + n)  # fmt: skip
    assert compilers == [], compilers
    pip = sorted(n for n in names if "/.cache/pip" in "/" + n or n.startswith("opt/tsproxy/bin/pip")
                 or "/site-packages/pip/" in n or n.startswith("run/secrets"))  # fmt: skip
    assert pip == [], pip
    # Code is root's and nobody else may change it; the user owns only its home (with the volume).
    for _, m in members:
        name = _name(m)
        if name.startswith(("opt/tsproxy", "opt/java")) and not m.issym():
            assert (m.uid, m.gid) == (0, 0) and not m.mode & 0o022, f"{name} {m.uid}:{m.gid} {m.mode:o}"
    homes = {_name(m): m for _, m in members if _name(m) in (WORKDIR[1:], CACHE_VOLUME[1:])}
    assert set(homes) == {WORKDIR[1:], CACHE_VOLUME[1:]}
    assert all((m.uid, m.gid) == (10001, 10001) for m in homes.values())
    # The cache volume is where the default cache_dir lands, and where docs/OPERATIONS.md says.
    default = Config().cache_dir
    assert default is not None and list(image.config["Volumes"]) == [f"{WORKDIR}/{default}"] == [CACHE_VOLUME]
    assert CACHE_VOLUME in (REPO / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    # No certificate of the build's CA secret that the image does not carry of its own accord (the
    # marker at least) is in any layer, as PEM text or DER bytes.
    own = _certificates(_last_file(layers[extras], "etc/ssl/certs/ca-certificates.crt"))
    foreign = [c for c in _certificates(built.secret.read_bytes()) if c not in own]
    assert _marker_ca() and any(c in foreign for c in _certificates(_marker_ca()))
    needles = []
    for der in foreign:
        pem = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).splitlines()
        needles += [pem[len(pem) // 2], der[len(der) // 2 : len(der) // 2 + 48]]
    for layer in layers[extras]:
        data = layer.path.read_bytes()
        for needle in needles:
            assert needle not in data, f"layer {layer.digest} holds a certificate of the build secret"
    has_java = any(n.startswith("opt/java/bin/java") for n in names)
    assert has_java == ("spark" in extras)
    assert not any(n.startswith("usr/lib/jvm/") for n in names), "a second Java next to the image's own"


def _name(member: tarfile.TarInfo) -> str:
    return member.name.removeprefix("./")


def _last_file(layers: list[Layer], name: str) -> bytes:
    """A file's content as the image's filesystem has it (the topmost layer that holds it)."""
    for layer in reversed(layers):
        with tarfile.open(layer.path, "r:*") as tar:
            for member in tar.getmembers():
                if _name(member) == name and member.isfile():
                    got = tar.extractfile(member)
                    assert got is not None
                    return got.read()
    return b""


def _certificates(pem: bytes) -> list[bytes]:
    """The DER bytes of every certificate in a PEM bundle."""
    out = []
    for block in pem.split(b"-----BEGIN CERTIFICATE-----")[1:]:
        text = b"-----BEGIN CERTIFICATE-----" + block.split(b"-----END CERTIFICATE-----")[0]
        cert = x509.load_pem_x509_certificate(text + b"-----END CERTIFICATE-----\n")
        out.append(cert.public_bytes(serialization.Encoding.DER))
    return out


def _tiered_partition() -> PartitionWriter:
    """Two small segments of one partition, three codecs, keys and headers."""
    writer = PartitionWriter("orders", 0)
    for segment, codec in enumerate(("none", "zstd")):
        for b in range(4):
            ts = 1_700_000_000_000 + segment * 10_000 + b * 100
            value = b"value-%d-%d-" % (segment, b)
            rows = [(ts + i, b"k%d" % i, value * (1 + i % 4), (("h", b"x"),)) for i in range(25)]
            writer.batch(rows, codec="gzip" if b == 3 else codec)
        writer.roll()
    return writer


def test_pipeline_image_exports_and_verifies_with_its_own_java(
    built: Built, config_dir: Path, tmp_path: Path
) -> None:
    import pyarrow.dataset as ds

    image = built.images["fast,spark"]
    box = Box(image, {config_dir: "/etc/tsproxy"})
    spark_env = {"SPARK_LOCAL_IP": "127.0.0.1"}
    try:
        java = box.run(["java", "-version"], timeout=120)
        assert java.returncode == 0 and "openjdk" in java.stderr.lower(), java.stderr
        assert box.run(["sh", "-c", 'test "$(command -v java)" = /opt/java/bin/java']).returncode == 0
        writer = _tiered_partition()
        with serving(box, tmp_path) as served:
            client = served.s3()
            client.create_bucket(Bucket="tiered")
            stored = upload_aiven(client, "tiered", "cluster-a/", writer.segments, kafka_uuid())
            assert len(stored) == len(writer.segments) == 2
            export = box.run(
                ["tsproxy", "export", "--master", "local[1]", "--endpoint", served.endpoint,
                 "--bucket", "tiered", "--prefix", "cluster-a/", "--topics", "orders",
                 "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, "--output", "/tmp/export",
                 "--json", "/tmp/export.json", "--conf", "spark.ui.enabled=false"],
                env=spark_env,
            )  # fmt: skip
            assert export.returncode == 0, export.stdout[-3000:] + export.stderr[-5000:]
            objects = len(client.list_objects_v2(Bucket="tiered")["Contents"])
        summary = json.loads((box.root / "tmp/export.json").read_text())
        expected = [row for seg in writer.segments for row in seg.rows]
        assert summary["records"] == len(expected) == 200
        table = ds.dataset(box.root / "tmp/export", format="parquet").to_table()
        assert sorted(table.column("offset").to_pylist()) == [row[0] for row in expected]
        # The store itself, read by the job straight from the data directory with the key ring.
        verify = box.run(
            ["tsproxy", "jobs", "verify", "--config", "/etc/tsproxy/tsproxy.toml", "--bucket", "tiered",
             "--master", "local[1]", "--output", "/tmp/verify"],
            env=spark_env,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-5000:]
        rows = ds.dataset(box.root / "tmp/verify/objects", format="parquet").to_table().to_pylist()
        assert len(rows) == objects and {r["status"] for r in rows} == {"ok"}, rows
    finally:
        box.remove()
