"""Key rotation while consumers read tiered data: add and activate a key, `tsproxy jobs rewrap --apply`,
remove the old key. Consumers read remote segments all along, and no read fails or differs."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.broker.fixtures import PLAIN, Dataset, Stack
from tests.broker.records import consume
from tests.broker.stack import wait_for
from tsproxy.format import KeyRing, open_object


class Readers:
    """A consumer reading PLAIN from the earliest offset (remote segments), pass after pass, until stopped."""

    def __init__(self, stack: Stack, dataset: Dataset) -> None:
        self.stack, self.dataset = stack, dataset
        self.passes = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for topic, n in ((PLAIN, 3),):
                    got = consume(self.stack.broker.bootstrap, topic, range(n), timeout=120)
                    for p in range(n):
                        if got[p] != self.dataset.produced[(topic, p)]:
                            self.errors.append(f"{topic}-{p}: records differ")
                self.passes += 1
            except Exception as e:  # a consumer error is what this test is about
                self.errors.append(repr(e))

    def passes_after(self, count: int) -> None:
        target = self.passes + count
        wait_for(lambda: self.passes >= target or self.errors, 300, "readers made no progress")


def _kek_ids(stack: Stack) -> set[str | None]:
    """The KEK of every encrypted object in the store, read from the stored tails."""
    ring = KeyRing.load(stack.tsproxy.key_ring)
    weed = stack.weed.boto3_client()
    ids: set[str | None] = set()
    for key in stack.stored_keys():
        if key.startswith(".tsproxy/"):
            continue
        stored = weed.get_object(Bucket=stack.bucket, Key=key)["Body"].read()
        manifest, _ = open_object(stored, ring)
        if manifest.encrypted:
            ids.add(manifest.kek_id)
    return ids


def test_key_rotation_while_consumers_read(stack: Stack, dataset: Dataset, tmp_path: Path) -> None:
    ring = str(stack.tsproxy.key_ring)
    old = {k for k in _kek_ids(stack) if k}
    assert len(old) == 1
    readers = Readers(stack, dataset)
    readers.thread.start()
    try:
        readers.passes_after(1)
        stack.tsproxy.cli("keys", "add", "--key-ring", ring, "--id", "kek-rotated")
        stack.tsproxy.cli("keys", "activate", "kek-rotated", "--key-ring", ring)
        wait_for(
            lambda: stack.tsproxy.metric("tsproxy_key_ring_active_info", kek_id="kek-rotated") == 1,
            30,
            "tsproxy did not load the new active key",
        )
        stack.tsproxy.cli(
            "jobs",
            "rewrap",
            "--bucket",
            stack.bucket,
            "--apply",
            "--output",
            str(tmp_path / "rewrap"),
            timeout=600,
        )
        assert _kek_ids(stack) == {"kek-rotated"}
        stack.tsproxy.cli("keys", "remove", *old, "--key-ring", ring, "--yes")
        wait_for(lambda: stack.tsproxy.metric("tsproxy_key_ring_keys") == 1, 30, "tsproxy kept the old key")
        readers.passes_after(2)  # at least one whole pass without the old key on the ring
    finally:
        readers.stop.set()
        readers.thread.join(300)
    assert not readers.errors, readers.errors[:5]
