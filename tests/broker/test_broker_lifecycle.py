"""tsproxy stopped, restarted and killed under a working broker.

- A restart (SIGTERM, start again on the same port) while the broker produces and tiers: the copies
  that failed meanwhile are retried by the broker, and the chunk cache on disk serves the reads after
  the restart without a chunk fetched again from the store.
- SIGKILL during a segment's multipart upload: the plugin's copy fails, the broker tries the segment
  again once tsproxy is back, every record reads back, and the janitor removes what the killed upload
  left in the store (its state under `.tsproxy/mpu/` and the backend's multipart upload).
"""

from __future__ import annotations

import json
import threading
import time

from tests.broker.fixtures import BIG_SEGMENT, PLAIN, Dataset, Stack
from tests.broker.records import consume, drafts, produce
from tests.broker.stack import wait_for


def test_restart_while_the_broker_works_keeps_the_cache(stack: Stack, dataset: Dataset) -> None:
    plain = consume(stack.broker.bootstrap, PLAIN, range(3))  # remote reads fill tsproxy's cache
    topic = "restarted"
    stack.broker.create_topic(topic, 1)
    produced: list[object] = []
    producing = threading.Thread(
        target=lambda: produced.extend(produce(stack.broker.bootstrap, topic, 0, drafts(60, 2500, 2000))),
        daemon=True,
    )
    producing.start()
    wait_for(lambda: len(stack.broker.local_segments(topic, 0)) >= 2, 60, "no segment rolled", stack.logs)
    stack.tsproxy.stop()  # SIGTERM: a graceful stop, uploads in flight finish or fail
    time.sleep(3)  # the broker's copy task runs every second and fails meanwhile
    stack.tsproxy.start()
    producing.join(120)
    assert not producing.is_alive()
    stack.wait_tiered(topic, 1)
    assert consume(stack.broker.bootstrap, topic, [0])[0] == produced

    # The restarted process reads the earlier topic's chunks from the disk cache, none from the store.
    assert stack.tsproxy.metric("tsproxy_cache_size_bytes") > 0
    misses = stack.tsproxy.metric("tsproxy_cache_requests_total", result="miss")
    hits = stack.tsproxy.metric("tsproxy_cache_requests_total", result="hit")
    assert consume(stack.broker.bootstrap, PLAIN, range(3)) == plain
    assert stack.tsproxy.metric("tsproxy_cache_requests_total", result="hit") > hits
    assert stack.tsproxy.metric("tsproxy_cache_requests_total", result="miss") == misses


def _upload_parts_seen(stack: Stack, prefix: str) -> bool:
    for line in stack.tsproxy.log_path.read_text(errors="replace").splitlines():
        if '"UploadPart"' in line and prefix in line and json.loads(line).get("status") == 200:
            return True
    return False


def test_sigkill_during_a_segment_upload(stack: Stack, dataset: Dataset) -> None:
    topic = "killed"
    stack.broker.create_topic(topic, 1, segment_bytes=str(BIG_SEGMENT))
    start = stack.tsproxy.log_path.stat().st_size
    broker_start = stack.broker.log_path.stat().st_size
    killed = threading.Event()

    def kill_at_first_part() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with open(stack.tsproxy.log_path, "rb") as f:
                f.seek(start)
                text = f.read().decode(errors="replace")
            if f"/{stack.bucket}/{topic}-" in text and '"UploadPart"' in text:
                stack.tsproxy.kill()  # the first part is in; the next parts are on their way
                killed.set()
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_at_first_part, daemon=True)
    killer.start()
    produced = produce(stack.broker.bootstrap, topic, 0, drafts(70, 2600, 10_000))
    killer.join(130)
    assert killed.is_set(), "no multipart upload of the topic was seen"

    def copy_failed() -> bool:
        with open(stack.broker.log_path, "rb") as f:
            f.seek(broker_start)
            return b"RemoteStorageException" in f.read()

    wait_for(copy_failed, 60, "the broker did not see its copy fail", stack.logs)
    stack.tsproxy.start()
    stack.wait_tiered(topic, 1)
    assert consume(stack.broker.bootstrap, topic, [0])[0] == produced

    # Every segment in the store is whole (its three objects), and once the janitor ran past
    # leftover_age nothing of the killed upload is left: no upload state, no backend multipart upload.
    prefix = stack.topic_prefix(topic)
    stored = stack.stored_keys(prefix)
    segments = {k.rsplit(".", 1)[0] for k in stored}
    for segment in segments:
        assert {f"{segment}.log", f"{segment}.indexes", f"{segment}.rsm-manifest"} <= stored.keys(), segment
    weed = stack.weed.boto3_client()

    def no_leftovers() -> bool:
        uploads = weed.list_multipart_uploads(Bucket=stack.bucket).get("Uploads", [])
        return not uploads and not stack.stored_keys(".tsproxy/mpu/")

    wait_for(no_leftovers, 90, "the janitor left upload state behind", stack.logs)
    assert stack.tsproxy.metric("tsproxy_janitor_removed_total") > 0
