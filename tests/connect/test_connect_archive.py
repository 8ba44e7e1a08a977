"""Aiven's S3 sink archives the broker tests' topics through tsproxy, and every record of its files is
the record a read_committed consumer reads from the broker, whole, with and without the sink's gzip.

The sink's consumer reads the topics from their start, so most of what it archives came back from
tiered storage through the same tsproxy. Its files go up as multipart uploads through tsproxy
(AWS SDK for Java v1, which checks each part's ETag against the MD5 of what it sent).
"""

from __future__ import annotations

import json
import random

import pytest

from tests.broker.fixtures import TXN, Dataset
from tests.broker.records import MARK, consume
from tests.connect.archive import by_partition, list_keys, read_sink_files
from tests.connect.conftest import Archive

pytestmark = pytest.mark.timeout(1800)  # the first test starts the stack, the data set and the sinks


def test_every_committed_record_is_in_the_sink_files_exactly_once(archive: Archive, dataset: Dataset) -> None:
    client = archive.client()
    for bucket in (archive.plain, archive.gzipped):
        files = read_sink_files(client, bucket)
        assert all(f.gzip == (bucket == archive.gzipped) for f in files.values()), bucket
        got = by_partition(files.values())
        compared = 0
        topics = archive.topics if bucket == archive.plain else archive.gzipped_topics
        for topic in topics:
            n = archive.topics[topic]
            consumed = consume(archive.stack.broker.bootstrap, topic, range(n), isolation="read_committed")
            for p in range(n):
                want = consumed[p]
                # read_committed on both sides: no record of an aborted transaction, and the consumer's
                # view is the data set's committed records.
                assert want == dataset.committed[(topic, p)], (topic, p)
                assert got.get((topic, p), []) == want, (bucket, topic, p)
                compared += len(want)
        assert compared == sum(len(v) for (t, _), v in dataset.committed.items() if t in topics)
    aborted = {r.offset for r in dataset.produced[(TXN, 0)]} - {r.offset for r in dataset.committed[(TXN, 0)]}
    assert aborted, "the data set holds aborted transactions"


def test_files_read_back_whole_and_by_range(archive: Archive) -> None:
    client = archive.client()
    rng = random.Random(34)
    checked = 0
    for bucket in (archive.plain, archive.gzipped):
        for key, size in list_keys(client, bucket).items():
            whole = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert len(whole) == size
            spans = [(0, min(size, 100) - 1), (max(0, size - 77), size - 1)]
            start = rng.randrange(size)
            spans.append((start, min(size - 1, start + rng.randrange(1, 6 * 1024 * 1024))))
            for first, last in spans:
                got = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")["Body"].read()
                assert got == whole[first : last + 1], (key, first, last)
            tail = client.get_object(Bucket=bucket, Key=key, Range="bytes=-10")["Body"].read()
            assert tail == whole[-10:]
            checked += 1
    assert checked >= 2 * len(archive.topics)


def test_the_store_holds_the_files_compressed_and_encrypted(archive: Archive) -> None:
    """tsproxy compressed and encrypted what the sink wrote: the store's bytes are not the sink's."""
    client = archive.client()
    for bucket in (archive.plain, archive.gzipped):
        seen = list_keys(client, bucket)
        stored = list_keys(archive.stack.weed.boto3_client(), bucket)
        assert set(stored) >= set(seen)
        raw = archive.stack.weed.boto3_client()
        for key in list(seen)[:5]:
            body = raw.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert MARK not in body and b'"offset":' not in body
    plain_seen = sum(list_keys(client, archive.plain).values())
    plain_stored = sum(list_keys(archive.stack.weed.boto3_client(), archive.plain).values())
    # JSON lines of base64 compress well: the store holds well under what the sink wrote.
    assert plain_stored < 0.7 * plain_seen, (plain_stored, plain_seen)


def _access_log(archive: Archive) -> list[dict[str, object]]:
    lines = archive.stack.tsproxy.log_path.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{") and '"tsproxy.access"' in line]


def test_sink_uploads_are_multipart_uploads_tsproxy_completed(archive: Archive) -> None:
    """Every file was a multipart upload (the sink never PUTs whole objects) that tsproxy completed: the
    SDK checks each part's ETag against the MD5 of what it sent, and fails the upload otherwise."""
    for bucket in (archive.plain, archive.gzipped):
        keys = list_keys(archive.client(), bucket)
        ops = [e for e in _access_log(archive) if str(e.get("path", "")).startswith(f"/{bucket}/")]
        writes = [
            e for e in ops if e.get("operation") in ("PutObject", "UploadPart", "CompleteMultipartUpload")
        ]
        assert all(e["status"] == 200 for e in writes), [e for e in writes if e["status"] != 200][:3]
        assert not [e for e in writes if e["operation"] == "PutObject"]
        completed = [e for e in writes if e["operation"] == "CompleteMultipartUpload"]
        assert len(completed) >= len(keys)
        parts = [e for e in writes if e["operation"] == "UploadPart"]
        assert len(parts) >= len(completed)  # files of several parts: test_connect_restarts
