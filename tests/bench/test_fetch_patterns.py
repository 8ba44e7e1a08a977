"""The pure parts of benchmarks/fetch.py: the segment it reads, its read patterns, its percentiles and
its goal checks. A benchmark whose pattern skips bytes or whose goals read the wrong row measures the
wrong thing without failing, so these pin them down."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import resource
import time
from typing import Any

import pytest
from fetch_support import (
    MIB,
    PUT,
    READ_SCENARIOS,
    SEQ_COLD,
    SEQ_WARM,
    UPLOAD,
    UPLOAD_SERIAL,
    CpuUse,
    Segment,
    build_segment,
    check_goals,
    chunk_reads,
    consumer_fetches,
    cpu_columns,
    machine_cpu,
    percentile,
    process_cpu,
    random_fetches,
)
from hypothesis import given
from hypothesis import strategies as st

from tsproxy.kafka.codecs import CODEC_NONE
from tsproxy.kafka.records import iter_batches, iter_records


@pytest.fixture(scope="module")
def segment() -> Segment:
    return build_segment(3 * MIB)


def test_segment_is_valid_uncompressed_kafka_data_with_json_values(segment: Segment) -> None:
    assert 3 * MIB - 64 * 1024 < segment.size <= 3 * MIB
    batches = list(iter_batches(segment.data))  # checks every CRC and length
    assert tuple(b.position for b in batches) == segment.positions
    assert all(b.codec == CODEC_NONE for b in batches)
    assert batches[-1].position + batches[-1].length + 12 == segment.size
    offsets = [r.offset for r in iter_records(segment.data)]
    assert offsets == list(range(len(offsets)))
    first = next(iter(iter_records(segment.data)))
    assert first.value is not None and first.value.startswith(b'{"offset":0,')


def test_segment_is_deterministic() -> None:
    assert build_segment(200_000) == build_segment(200_000)
    assert build_segment(200_000, seed=1) != build_segment(200_000)


def test_segment_too_small_for_a_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        build_segment(1000)


def test_consumer_fetches_cover_the_segment_from_batch_starts(segment: Segment) -> None:
    ranges = consumer_fetches(segment)
    assert ranges[0][0] == 0 and ranges[-1][1] == segment.size
    starts = set(segment.positions)
    for (start, end), (next_start, _) in itertools.pairwise(ranges):
        assert start in starts and end - start == MIB
        # the next fetch starts at the first batch this one did not hold whole: no gap, overlap < a batch
        assert start < next_start <= end
        following = [p for p in segment.positions if p > next_start]
        assert not following or following[0] > end


def test_consumer_fetches_from_a_later_start(segment: Segment) -> None:
    start = segment.positions[len(segment.positions) // 2]
    ranges = consumer_fetches(segment, start=start)
    assert ranges[0][0] == start and ranges[-1][1] == segment.size


@given(size=st.integers(1, 50 * MIB), chunk=st.sampled_from([MIB, 4 * MIB, 5 * MIB + 3]))
def test_chunk_reads_tile_the_object(size: int, chunk: int) -> None:
    ranges = chunk_reads(size, chunk)
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert all(start % chunk == 0 and end - start <= chunk for start, end in ranges)


def test_random_fetches_start_at_batches_and_repeat_with_the_seed(segment: Segment) -> None:
    ranges = random_fetches(segment, 20)
    assert len(ranges) == 20 and ranges == random_fetches(segment, 20)
    assert all(s in segment.positions and 0 < e - s <= MIB and e <= segment.size for s, e in ranges)
    assert len({s for s, _ in ranges}) > 1


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.5) == 2.5
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 4.0
    assert percentile(list(map(float, range(101))), 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert math.isnan(percentile([], 0.5))


def _row(system: str, scenario: str, mib_s: float, p50: float = 5.0, gets: float = 1.0) -> dict[str, Any]:
    return {
        "system": system,
        "scenario": scenario,
        "mib_s": mib_s,
        "p50_ms": p50,
        "p99_ms": p50 * 2,
        "backend_gets_per_mib": gets,
        "backend_bytes_ratio": 1.0,
    }


def test_goals_compare_the_right_rows() -> None:
    rows = [
        _row("direct", UPLOAD, 100.0),
        _row("tsproxy", UPLOAD, 99.0),
        _row("direct", UPLOAD_SERIAL, 100.0),
        {**_row("tsproxy", UPLOAD_SERIAL, 120.0), "backend_requests": 14, "parts": 11},
        _row("direct", SEQ_COLD, 100.0),
        _row("tsproxy", SEQ_COLD, 80.0, gets=0.1),
        _row("direct", SEQ_WARM, 500.0, p50=4.0),
        _row("tsproxy", SEQ_WARM, 10.0, p50=2.0),
    ]
    rows += [_row("rclone", s, 10.0) for s in READ_SCENARIOS]
    rows += [_row("tsproxy", s, 30.0) for s in READ_SCENARIOS if s not in (SEQ_COLD, SEQ_WARM)]
    goals = {g.name: g for g in check_goals(rows)}
    assert len(goals) == 9 + len(READ_SCENARIOS)
    serial = goals[f"{UPLOAD_SERIAL} MiB/s, tsproxy / direct"]
    assert serial.value == pytest.approx(1.2) and serial.passed is True
    assert goals[f"{UPLOAD_SERIAL} backend requests beyond parts + 3, tsproxy"].value == 0
    assert goals[f"{PUT} MiB/s, tsproxy / direct"].passed is None  # not measured: not checked
    warm = goals[f"{SEQ_WARM} p50 latency, tsproxy / direct"]
    assert warm.value == 0.5 and warm.passed is True
    cold = goals[f"{SEQ_COLD} MiB/s, tsproxy / direct"]
    assert cold.value == 0.8 and cold.passed is False  # the goal is 1.0 now
    assert goals[f"{SEQ_COLD} backend GETs per MiB, tsproxy"].passed is True
    upload = goals[f"{UPLOAD} MiB/s, tsproxy / direct"]
    assert upload.value == pytest.approx(0.99) and upload.passed is False
    assert goals[f"{SEQ_COLD} MiB/s, tsproxy / rclone"].value == 8.0
    assert goals[f"{SEQ_WARM} MiB/s, tsproxy / rclone"].passed is False  # 10 vs 10
    assert all(g.passed is True for n, g in goals.items() if "rclone" in n and SEQ_WARM not in n)
    assert "FAIL" in upload.line() and "0.990" in upload.line()


def test_goals_without_a_system_are_not_checked() -> None:
    rows = [_row("tsproxy", s, 50.0) for s in (UPLOAD, *READ_SCENARIOS)]
    goals = check_goals(rows)
    by_name = {g.name: g for g in goals}
    assert by_name[f"{SEQ_COLD} backend GETs per MiB, tsproxy"].passed is False  # 1.0 > 0.1
    others = [g for n, g in by_name.items() if "GETs" not in n]
    assert others and all(g.passed is None and g.line().startswith("n/a") for g in others)


def _burn(seconds: float) -> None:
    """Keep this process's one thread busy for `seconds` of CPU time."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        hashlib.sha256(b"x" * 65536).digest()


def test_process_cpu_reads_what_the_process_used() -> None:
    # A wrong field of /proc/PID/stat (or ticks taken for seconds) would be far off what the process
    # itself says it used, and would not grow with the work done.
    own = os.getpid()
    before, machine_before = process_cpu(own), machine_cpu()
    _burn(0.3)
    used, machine_used = process_cpu(own) - before, machine_cpu() - machine_before
    assert used == pytest.approx(0.3, abs=0.08)
    mine = resource.getrusage(resource.RUSAGE_SELF)
    assert process_cpu(own) == pytest.approx(mine.ru_utime + mine.ru_stime, abs=0.05)
    # The machine was busy at least while this process was.
    assert machine_used >= used - 0.05
    assert process_cpu(None) == 0.0


def test_cpu_columns_are_per_gib_of_client_bytes() -> None:
    use = CpuUse(client=3.0, system=4.0, backend=5.0, machine=12.0) - CpuUse(1.0, 2.0, 1.0, 2.0)
    assert use == CpuUse(client=2.0, system=2.0, backend=4.0, machine=10.0)
    assert cpu_columns(use, 512 * MIB) == {
        "cpu_client": 4.0,
        "cpu_system": 4.0,
        "cpu_backend": 8.0,
        "cpu_machine": 20.0,
    }
    direct = CpuUse(1.0, None, 2.0, 3.0) - CpuUse(0.0, None, 1.0, 1.0)
    assert direct.system is None and cpu_columns(direct, 1 << 30)["cpu_system"] is None
