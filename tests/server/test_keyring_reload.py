"""Key rotation without a restart: the server picks up a changed key ring file (periodic check, SIGHUP)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.server.harness import RunningProxy, start_local
from tests.support.waiting import eventually
from tsproxy.format import KeyRing


def _eventually(check: Callable[[], bool], timeout: float = 20) -> None:
    eventually(check, timeout)


def _reloads(p: RunningProxy, outcome: str) -> float:
    return float(p.proxy.metrics.key_ring_reloads.labels(outcome)._value.get())


def _kek(p: RunningProxy, bucket: str, key: str) -> str:
    p.proxy.objects.replace_keyring(p.proxy.objects.keyring)  # type: ignore[arg-type]  # forget resolved
    return str(p.call(p.proxy.objects.resolve(bucket, key)).manifest.kek_id)


@pytest.fixture
def ring_path(tmp_path: Path) -> Path:
    path = tmp_path / "ring.json"
    KeyRing.new(key_id="kek-a").save(path)
    return path


@pytest.fixture
def served(tmp_path: Path, ring_path: Path) -> Iterator[RunningProxy]:
    p = start_local(tmp_path, key_ring_check="100ms")
    p.call(p.proxy.objects.create_bucket("rot"))
    yield p
    p.stop()


def test_rotation_steps_apply_without_restart(served: RunningProxy, ring_path: Path) -> None:
    s3 = served.client()
    s3.put_object(Bucket="rot", Key="old", Body=b"written under a" * 1000)
    assert _kek(served, "rot", "old") == "kek-a"

    # Steps 1 and 2 of the runbook, in one go: add a key and activate it.
    ring = KeyRing.load(ring_path)
    ring.add(key_id="kek-b")
    ring.activate("kek-b")
    ring.save(ring_path)
    _eventually(lambda: _reloads(served, "ok") == 1)
    assert _active(served) == ["kek-b"]
    s3.put_object(Bucket="rot", Key="new", Body=b"written under b" * 1000)
    assert _kek(served, "rot", "new") == "kek-b"
    assert s3.get_object(Bucket="rot", Key="old")["Body"].read() == b"written under a" * 1000
    assert s3.get_object(Bucket="rot", Key="new")["Body"].read() == b"written under b" * 1000

    # A broken file is refused (once per change), the ring in use stays.
    ring_path.write_text("{not json")
    _eventually(lambda: _reloads(served, "error") == 1)
    time.sleep(0.5)  # several more checks of the unchanged broken file
    assert _reloads(served, "error") == 1 and _reloads(served, "ok") == 1
    s3.put_object(Bucket="rot", Key="newer", Body=b"still b")
    assert _kek(served, "rot", "newer") == "kek-b"
    assert s3.get_object(Bucket="rot", Key="old")["Body"].read() == b"written under a" * 1000

    # Removing a key takes effect at once, even for objects read a moment ago (no stale resolution).
    ring.remove("kek-a")
    ring.save(ring_path)
    _eventually(lambda: _reloads(served, "ok") == 2)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="rot", Key="old")
    assert e.value.response["Error"]["Code"] == "InternalError"
    assert s3.get_object(Bucket="rot", Key="new")["Body"].read() == b"written under b" * 1000
    assert served.proxy.metrics.key_ring_keys._value.get() == 1
    assert _active(served) == ["kek-b"]


def _active(p: RunningProxy) -> list[str]:
    """The kek_id labels of the tsproxy_key_ring_active_info series (exactly one expected)."""
    samples = p.proxy.metrics.key_ring_active.collect()[0].samples
    return [s.labels["kek_id"] for s in samples if s.value == 1]


def test_unchanged_file_is_not_reloaded(served: RunningProxy) -> None:
    assert _active(served) == ["kek-a"]
    time.sleep(0.5)
    assert _reloads(served, "ok") == 0 and _reloads(served, "error") == 0
    assert served.proxy.metrics.key_ring_keys._value.get() == 1
