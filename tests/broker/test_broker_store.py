"""What the plugin's uploads became in SeaweedFS: tsproxy objects, encrypted, compressed where it pays.

The store is read past tsproxy (SeaweedFS's own S3 API and its files on disk) and decoded with
tsproxy's format code and the key ring, so the checks do not trust the server that wrote the objects.
"""

from __future__ import annotations

from pathlib import Path

from tests.broker.fixtures import BIG, CODECS, PLAIN, TXN, Dataset, Stack
from tests.broker.records import MARK
from tsproxy.format import KeyRing, decode_object, open_object


def _contains(path: Path, needle: bytes, block: int = 8 << 20) -> bool:
    """Whether the file holds `needle`, read in blocks (the store's volume files can be large)."""
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(block):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def test_segments_are_stored_encrypted_in_tsproxys_format(stack: Stack, dataset: Dataset) -> None:
    ring = KeyRing.load(stack.tsproxy.key_ring)
    weed = stack.weed.boto3_client()
    through = stack.tsproxy.boto3_client()
    checked = 0
    for topic in (PLAIN, CODECS, TXN, BIG):
        prefix = stack.topic_prefix(topic)
        for key in stack.stored_keys(prefix):
            stored = weed.get_object(Bucket=stack.bucket, Key=key)["Body"].read()
            assert MARK not in stored, key
            manifest, _ = open_object(stored, ring)
            assert manifest.encrypted and manifest.kek_id is not None, key
            original = decode_object(stored, ring)
            assert original == through.get_object(Bucket=stack.bucket, Key=key)["Body"].read(), key
            if key.endswith(".log") and topic != CODECS:
                assert MARK in original  # so the check above would have found a value in the clear
            checked += 1
    assert checked >= 3 * 10


def test_no_record_value_in_the_stores_files(stack: Stack, dataset: Dataset) -> None:
    files = [p for p in (stack.weed.base_dir / "data").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) > 10 << 20
    assert not [p for p in files if _contains(p, MARK)]


def test_compressed_where_it_pays(stack: Stack, dataset: Dataset) -> None:
    """Segments of uncompressed batches shrink; segments whose producer compressed its batches are
    stored as they are (tsproxy's `compression = auto`), within the size of encryption's framing."""

    def sizes(topic: str) -> tuple[int, int]:
        prefix = stack.topic_prefix(topic)
        stored = {k: v for k, v in stack.stored_keys(prefix).items() if k.endswith(".log")}
        original = {k: v for k, v in stack.client_keys(prefix).items() if k.endswith(".log")}
        assert stored and stored.keys() == original.keys()
        return sum(stored.values()), sum(original.values())

    for topic in (PLAIN, BIG):
        stored, original = sizes(topic)
        assert stored < original * 0.6, (topic, stored, original)
    stored, original = sizes(CODECS)
    assert original <= stored < original * 1.02, (stored, original)
