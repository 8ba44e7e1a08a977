"""Part records of multipart uploads: read whole, or by their head alone (without a part kept inside)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tsproxy.format import SegmentInfo
from tsproxy.service.uploads.records import PartRecord

WHEN = datetime(2026, 1, 2, tzinfo=UTC)


def _record(inline: bytes | None, chunks: int = 3) -> PartRecord:
    stored = len(inline) if inline is not None else 4096 * chunks
    sizes = tuple([stored // chunks] * (chunks - 1) + [stored - stored // chunks * (chunks - 1)])
    segment = SegmentInfo(4, b"salt0123", chunks << 20, bytes(range(16)), sizes, True)
    return PartRecord(4, "ab" * 16, chunks << 20, "", segment, WHEN, None, inline)


@pytest.mark.parametrize("inline", [b"x" * 5000, None])
def test_the_head_alone_gives_the_record_without_the_part(inline: bytes | None) -> None:
    record = _record(inline)
    data = record.to_bytes()
    head_len = len(data) - (len(inline) if inline else 0)
    for read in (head_len, head_len + 10, len(data)):
        found = PartRecord.from_head(data[:read], len(data), WHEN, "etag")
        assert found == record and found.inline is None and found.record_etag == "etag"
        assert found.kept_inline == record.kept_inline
    # The part kept inside starts where a ranged read of it will look.
    if inline is not None:
        assert data[record.inline_offset :] == inline
        assert PartRecord.from_head(data[:head_len], len(data), WHEN).inline_offset == record.inline_offset


def test_a_head_cut_short_asks_for_the_whole_record() -> None:
    data = _record(b"y" * 3000, chunks=400).to_bytes()
    newline = data.index(b"\n")
    assert PartRecord.from_head(data[:newline], len(data), WHEN) is None
    assert PartRecord.from_head(data[: newline + 20], len(data), WHEN) is None


def test_a_record_claiming_more_than_it_holds_is_refused() -> None:
    data = _record(b"z" * 100).to_bytes()
    with pytest.raises(ValueError):
        PartRecord.from_head(data, 10, WHEN)
