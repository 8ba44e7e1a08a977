"""The jobs' async engine without Spark: a task's work over a real LocalBackend, the rate-limited
backend wrapper, the tail probe and the command line's configuration handling."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.jobs.jobhelpers import records
from tsproxy.config import Config
from tsproxy.format import KeyRing, TransformSettings, encode_object
from tsproxy.format.manifest import META_FORMAT
from tsproxy.jobs import cli as jobs_cli
from tsproxy.jobs.engine import ROWS_DIR, TaskStats, run_partition
from tsproxy.jobs.options import JobOptions
from tsproxy.jobs.plan import Listed
from tsproxy.jobs.probe import probe
from tsproxy.jobs.ratelimit import RateLimitedRequests, RateLimiter
from tsproxy.jobs.verify import VerifyJob
from tsproxy.store.local import LocalBackend


async def _seed(root: Path, ring: KeyRing) -> dict[str, bytes]:
    """Stored objects written straight into a local backend, as tsproxy would store them."""
    backend = LocalBackend(root, fsync=False)
    await backend.start()
    await backend.create_bucket("jobs")
    stored = {
        "good": encode_object(records(300_000, 1), TransformSettings(chunk_size=1 << 16), ring),
        "empty": encode_object(b"", TransformSettings(chunk_size=1 << 16), ring),
    }
    bad = bytearray(stored["good"])
    bad[500] ^= 4
    stored["bad"] = bytes(bad)
    for key, data in stored.items():
        await backend.put("jobs", key, data, metadata={META_FORMAT: "1"})
    await backend.put("jobs", "plain", b"hello")
    await backend.close()
    return stored


async def test_a_task_verifies_its_objects_and_writes_its_rows(tmp_path: Path) -> None:
    ring = KeyRing.new()
    ring.save(tmp_path / "ring.json")
    await _seed(tmp_path / "store", ring)
    settings = Config(backend=f"file://{tmp_path / 'store'}", key_ring=tmp_path / "ring.json")
    options = JobOptions.from_config(settings, "jobs")
    items = [Listed(k, 0, "", 0.0) for k in ("bad", "empty", "gone", "good", "plain")]
    result = await_in_thread(run_partition, VerifyJob(), options, str(tmp_path / "out"), 3, items)
    rows = pq.read_table(tmp_path / "out" / ROWS_DIR / "part-00003.parquet").to_pylist()
    assert [(r["key"], r["status"]) for r in rows] == [
        ("bad", "corrupt"),
        ("empty", "ok"),
        ("gone", "vanished"),
        ("good", "ok"),
        ("plain", "passthrough"),
    ]
    assert result.summary.counts == {"corrupt": 1, "ok": 2, "vanished": 1, "passthrough": 1}
    stats: TaskStats = result.stats
    assert stats.tasks == 1 and stats.objects == 5 and stats.requests >= 5
    assert stats.bytes_in >= 2 * 300_000 // 3  # the good and the bad object were read (compressed)


def await_in_thread(fn: Any, *args: Any) -> Any:
    # run_partition calls asyncio.run itself, as a Spark task does; a worker thread has no running loop.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


class CountingLimiter(RateLimiter):
    def __init__(self) -> None:
        super().__init__(None)
        self.calls = 0

    async def acquire(self, cost: float = 1.0) -> None:
        self.calls += 1


async def test_every_backend_request_waits_for_the_limiter(tmp_path: Path) -> None:
    seen: list[str] = []
    limiter = CountingLimiter()
    backend = LocalBackend(
        tmp_path, fsync=False, on_request=RateLimitedRequests(limiter, lambda op, *_: seen.append(op))
    )
    await backend.start()
    await backend.create_bucket("lim")
    await backend.put("lim", "a", b"x" * 10)
    await backend.head("lim", "a")
    await backend.get_bytes("lim", "a", 0, 3)
    upload = await backend.create_multipart("lim", "b")
    etag = await backend.upload_part_copy("lim", "b", upload, 1, "lim", "a")
    await backend.complete_multipart("lim", "b", upload, [(1, etag)])
    await backend.list("lim")
    await backend.delete_many("lim", ["a", "b"])
    await backend.close()
    # One wait per backend request (the local backend makes its DeleteObjects one DeleteObject per key).
    assert limiter.calls == len(seen) == 10


async def test_probe_tells_objects_apart(tmp_path: Path) -> None:
    ring = KeyRing.new()
    stored = await _seed(tmp_path, ring)
    backend = LocalBackend(tmp_path, fsync=False)
    await backend.start()
    await backend.put("jobs", "cut", stored["good"][:-3], metadata={META_FORMAT: "1"})
    good = await probe(backend, "jobs", "good", guess=64)  # a tail longer than the guess: a second GET
    empty = await probe(backend, "jobs", "empty")
    plain = await probe(backend, "jobs", "plain")
    cut = await probe(backend, "jobs", "cut")
    await backend.close()
    assert good.written_by_tsproxy and good.tail is not None and stored["good"].endswith(good.tail)
    assert good.data_size == len(stored["good"]) - len(good.tail)
    assert empty.tail is not None and empty.data_size == 0
    assert not plain.written_by_tsproxy and not plain.has_trailer and plain.data_size == 5
    assert cut.written_by_tsproxy and not cut.has_trailer


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    jobs_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["jobs", *argv])


def test_cli_builds_options_from_config_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(
        'backend = "http://127.0.0.1:1"\nbackend_access_key = "ak"\nbackend_secret_key = "s3cr3t-value"\n'
        f'key_ring = "{tmp_path / "ring.json"}"\nchunk_size = "1MiB"\n'
    )
    args = _args(
        "migrate",
        "--config",
        str(config),
        "--bucket",
        "b",
        "--prefix",
        "p/",
        "--rate",
        "50",
        "--stale-after",
        "2h",
        "--compression",
        "off",
    )
    options = jobs_cli.options_from_args(args)
    assert (options.backend, options.access_key, options.secret_key) == (
        "http://127.0.0.1:1",
        "ak",
        "s3cr3t-value",
    )
    assert (options.bucket, options.prefix, options.rate, options.stale_after) == ("b", "p/", 50.0, 7200.0)
    assert (options.chunk_size, options.compression, options.concurrency) == (1 << 20, "off", 4)
    assert "s3cr3t" not in repr(options)
    assert options.replace(task_slots=4).task_rate == 12.5


def test_cli_reports_bad_configuration_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert jobs_cli.main(["verify", "--backend", "ftp://nowhere", "--bucket", "b"]) == 2
    assert "backend" in capsys.readouterr().err
    missing = str(tmp_path / "absent.json")
    assert (
        jobs_cli.main(["rewrap", "--backend", f"file://{tmp_path}", "--key-ring", missing, "--bucket", "b"])
        == 2
    )
    assert "absent.json" in capsys.readouterr().err


def test_cli_without_encryption_needs_no_key_ring() -> None:
    with pytest.raises(Exception, match="key_ring"):
        jobs_cli.options_from_args(_args("verify", "--backend", "http://127.0.0.1:1", "--bucket", "b"))
    args = _args("verify", "--backend", "http://127.0.0.1:1", "--bucket", "b", "--no-encryption")
    options = jobs_cli.options_from_args(args)
    assert options.key_ring is None and options.encryption is False
    assert options.load_ring() is None
