"""rewrap and verify on Spark against a real SeaweedFS: objects/s and MiB/s on local[1] and local[2],
and the backend bytes rewrap moves beside what downloading and re-uploading every object would.

Objects are stored exactly as tsproxy stores them (chunked, encrypted, with the tsproxy tail and
metadata), written straight into SeaweedFS so that setting up is quick. Bytes are counted by the
backend's own request observer in every task (bytes downloaded plus bytes uploaded).

    .venv/bin/python benchmarks/jobs.py [--objects 16] [--size-mib 32] [--data random|records] [--json F]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import MIB, Seaweed, kafka_like, print_table, write_json

from tsproxy.config import Config
from tsproxy.format import KeyRing, TransformSettings, encode_object, open_object
from tsproxy.format.manifest import TRAILER_SIZE, tail_length
from tsproxy.jobs import JobOptions, rewrap, spark_session, verify
from tsproxy.s3.limits import MIN_PART_SIZE

GOAL_SHARE = 0.01  # rewrap moves at most 1% of the bytes of a download and re-upload


def make_objects(s3: Any, bucket: str, ring: KeyRing, count: int, size: int, data: str) -> tuple[int, int]:
    """Write `count` tsproxy objects of `size` original bytes; return their stored bytes, in all and of
    the smallest."""
    rng = random.Random(1)
    settings = TransformSettings(chunk_size=4 * MIB)
    block = kafka_like(8 * MIB) if data == "records" else b""
    stored_total, smallest = 0, None
    for i in range(count):
        if data == "records":
            start = rng.randrange(len(block))
            original = (block[start:] + block) * (size // len(block) + 2)
            original = original[:size]
        else:
            # Segments of producer-compressed batches do not compress again.
            original = rng.randbytes(size)
        stored = encode_object(original, settings, ring)
        manifest, _ = open_object(stored, ring)
        metadata = manifest.backend_metadata(tail_length(stored[-TRAILER_SIZE:]))
        s3.put_object(Bucket=bucket, Key=f"topic-{i % 4}/segment-{i:05d}.log", Body=stored, Metadata=metadata)
        stored_total += len(stored)
        smallest = len(stored) if smallest is None else min(smallest, len(stored))
    return stored_total, smallest or 0


def row(job: str, master: str, run: Any, stored: int) -> dict[str, Any]:
    moved = run.stats.bytes_in + run.stats.bytes_out
    return {
        "job": job,
        "master": master,
        "objects": run.objects,
        "stored_mib": stored / MIB,
        "seconds": run.seconds,
        "objects_per_s": run.objects / run.seconds,
        "mib_per_s": stored / MIB / run.seconds,
        "backend_mib_moved": moved / MIB,
        "share_of_copy": moved / (2 * stored),  # a download and a re-upload of every stored byte
        "requests": run.stats.requests,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--size-mib", type=int, default=32, help="original size of each object")
    ap.add_argument("--data", choices=["random", "records"], default="random")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tsproxy-bench-jobs-"))
    ring_path = work / "ring.json"
    ring = KeyRing.new(key_id="kek-0")
    ring.save(ring_path)
    weed = Seaweed(work)
    rows: list[dict[str, Any]] = []
    spark = None
    try:
        s3 = weed.client()
        bucket = "bench-jobs"
        s3.create_bucket(Bucket=bucket)
        stored, smallest = make_objects(s3, bucket, ring, args.objects, args.size_mib * MIB, args.data)
        print(f"{args.objects} objects, {stored / MIB:.1f} MiB stored", file=sys.stderr)
        settings = Config(
            backend=weed.endpoint,
            key_ring=ring_path,
            backend_region="us-east-1",
            backend_access_key=weed.access_key,
            backend_secret_key=weed.secret_key,
        )
        options = JobOptions.from_config(settings, bucket, concurrency=4)
        for n, master in enumerate(("local[1]", "local[2]"), 1):
            if spark is not None:
                spark.stop()
            spark = spark_session(master, app_name="tsproxy-bench-jobs")
            # Every rewrap run needs objects on an old KEK: a new KEK becomes active before each.
            ring = KeyRing.load(ring_path)
            ring.add(key_id=f"kek-{n}")
            ring.activate(f"kek-{n}")
            ring.save(ring_path)
            out = work / f"out-{n}"
            r = rewrap(spark, options, output=str(out / "rewrap"), progress_every=3600)
            assert r.summary.tally.counts == {"rewrapped": args.objects}, r.text()
            rows.append(row("rewrap", master, r.run, stored))
            v = verify(spark, options, output=str(out / "verify"), progress_every=3600)
            assert v.ok, v.text()
            rows.append(row("verify", master, v.run, stored))
    finally:
        if spark is not None:
            spark.stop()
        weed.stop()

    print_table(
        rows,
        [
            "job",
            "master",
            "objects",
            "stored_mib",
            "seconds",
            "objects_per_s",
            "mib_per_s",
            "backend_mib_moved",
            "share_of_copy",
            "requests",
        ],
    )
    by = {(r["job"], r["master"]): r for r in rows}
    share = max(r["share_of_copy"] for r in rows if r["job"] == "rewrap")
    scaling = by[("verify", "local[2]")]["mib_per_s"] / by[("verify", "local[1]")]["mib_per_s"]
    # An object stored in less than the minimum part size cannot be copied server-side in parts: rewrap
    # uploads it again whole, so the goal speaks only of objects at least that big.
    applies = smallest >= MIN_PART_SIZE
    verdict = ("met" if share <= GOAL_SHARE else "NOT met") if applies else "not checked"
    goal = f"goal <= {GOAL_SHARE:.0%}"
    print(f"rewrap moved at most {share:.4%} of a download and re-upload ({goal}): {verdict}")
    if not applies:
        print(
            f"  (objects stored in less than {MIN_PART_SIZE // MIB} MiB are uploaded again whole: run "
            "with a larger --size-mib to check the goal)"
        )
    print(f"verify MiB/s, local[2] / local[1]: {scaling:.2f}x (SeaweedFS shares the same cores)")
    write_json(args.json, rows)
    return 1 if applies and share > GOAL_SHARE else 0


if __name__ == "__main__":
    sys.exit(main())
