"""Segments: the unit the store path transforms in one pass (a single PUT, or one part of a multipart upload).

A segment is cut into chunks of the object's chunk size (the last may be short), and each chunk goes
up the segment's UploadChain (pipeline.py): compressed with zstd when the segment's compression
decision says so and the result is strictly smaller, then sealed with AES-256-GCM (16-byte tag,
derived nonce) or, without encryption, stored as is with its CRC32C recorded. A stored chunk is
therefore raw exactly when its length is the original length plus the seal's overhead; no per-chunk
flag is needed. This module buffers, counts and records; the stages do the transforming.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tsproxy.errors import EntityTooLarge, FormatError

from .context import MAX_SEGMENT_NO, SALT_SIZE, ObjectContext
from .index import decode_sizes, encode_sizes
from .pipeline import Stages, UploadChain
from .settings import MIN_CHUNK_SIZE, TransformSettings
from .wire import Reader, Writer

_INFO_VERSION = 1
_F_COMPRESSED = 0x01
_F_SALT = 0x02
_F_CRC = 0x04
MD5_SIZE = 16
# S3's largest single PUT or part; a segment is one of those.
MAX_SEGMENT_SIZE = 5 << 30
_MIN_BUFFER = 64 * 1024


@dataclass(frozen=True)
class SegmentInfo:
    """What the manifest records of one segment once it is transformed."""

    segment_no: int
    salt: bytes  # 8 random bytes with encryption, empty without
    original_size: int
    md5: bytes  # MD5 of the segment's original bytes
    stored_sizes: tuple[int, ...]
    compressed: bool  # whether compression was attempted (auto may decide not to); informational
    crc32c: tuple[int, ...] = ()  # CRC32C of each stored chunk, without encryption only

    def __post_init__(self) -> None:
        if not 1 <= self.segment_no <= MAX_SEGMENT_NO:
            raise ValueError(f"segment_no {self.segment_no} is not within 1..{MAX_SEGMENT_NO}")
        if len(self.salt) not in (0, SALT_SIZE):
            raise ValueError("salt must be 8 bytes (encrypted) or empty")
        if len(self.md5) != MD5_SIZE:
            raise ValueError("md5 must be 16 bytes")
        if not 0 <= self.original_size <= MAX_SEGMENT_SIZE:
            raise ValueError(f"original_size must be within 0..{MAX_SEGMENT_SIZE}")
        if self.crc32c and len(self.crc32c) != len(self.stored_sizes):
            raise ValueError("one CRC32C per stored chunk")
        if self.salt and self.crc32c:
            raise ValueError("an encrypted segment has no CRC32Cs; its chunks carry tags")
        if not self.salt and len(self.crc32c) != len(self.stored_sizes):
            raise ValueError("an unencrypted segment needs a CRC32C per chunk")

    @property
    def stored_size(self) -> int:
        """Bytes the segment's chunks take in the backend."""
        return sum(self.stored_sizes)

    def write(self, w: Writer) -> None:
        """Append the segment's manifest encoding to w."""
        w.varint(self.segment_no)
        flags = (_F_COMPRESSED if self.compressed else 0) | (_F_SALT if self.salt else 0)
        flags |= _F_CRC if self.crc32c else 0
        w.u8(flags)
        w.raw(self.salt)
        w.varint(self.original_size)
        w.raw(self.md5)
        w.raw(encode_sizes(self.stored_sizes))
        if self.crc32c:
            w.raw(b"".join(c.to_bytes(4, "big") for c in self.crc32c))

    @classmethod
    def read(cls, r: Reader, chunk_size: int | None = None, stages: Stages | None = None) -> SegmentInfo:
        """Read one segment written by write(); IntegrityError when malformed.

        Inside a manifest, chunk_size and the object's stages are known: the chunk count must be exactly
        the one the segment's size implies, and salt or CRC32Cs must be what the seal stage records (a
        keyed one a salt, an unkeyed one CRC32Cs). Counts are bounded before anything is allocated for them.
        """
        segment_no = r.varint(MAX_SEGMENT_NO)
        flags = r.u8()
        if flags & ~(_F_COMPRESSED | _F_SALT | _F_CRC) or (flags & _F_SALT and flags & _F_CRC):
            raise r.fail(f"bad segment flags {flags:#x}")
        if stages is not None and bool(flags & _F_SALT) != stages.keyed:
            raise r.fail(f"segment {segment_no} disagrees with the manifest on encryption")
        salt = bytes(r.take(SALT_SIZE)) if flags & _F_SALT else b""
        original_size = r.varint(MAX_SEGMENT_SIZE)
        md5 = bytes(r.take(MD5_SIZE))
        # Equal sizes pack into zero bits, so the encoded length cannot bound the chunk count; the
        # segment size can, and so can the CRC32Cs (4 bytes a chunk) when they follow.
        expected = -(-original_size // (chunk_size or MIN_CHUNK_SIZE))
        if flags & _F_CRC:
            bound = min(expected, r.remaining() // 4)
        elif flags & _F_SALT:
            bound = expected
        else:
            bound = 0  # unencrypted and no CRC32Cs: only an empty segment
        sizes = decode_sizes(r, bound)
        if chunk_size is not None and len(sizes) != expected:
            raise r.fail(f"segment {segment_no}: {len(sizes)} chunks where its size needs {expected}")
        crcs: tuple[int, ...] = ()
        if flags & _F_CRC:
            raw = r.take(4 * len(sizes))
            crcs = tuple(int.from_bytes(raw[i : i + 4], "big") for i in range(0, len(raw), 4))
        try:
            return cls(segment_no, salt, original_size, md5, sizes, bool(flags & _F_COMPRESSED), crcs)
        except ValueError as e:
            raise r.fail(str(e)) from None

    def to_bytes(self) -> bytes:
        """Self-contained bytes (e.g. to keep with a multipart part until completion)."""
        w = Writer()
        w.u8(_INFO_VERSION)
        self.write(w)
        return bytes(w.buf)

    @classmethod
    def from_bytes(cls, data: bytes) -> SegmentInfo:
        """Inverse of to_bytes(); FormatError (IntegrityError when malformed)."""
        r = Reader(data, "segment info")
        if r.u8() != _INFO_VERSION:
            raise FormatError("segment info: unknown version")
        info = cls.read(r)
        r.end()
        return info


class SegmentEncoder:
    """Sans-IO streaming encoder of one segment: original bytes in, stored chunks out.

    Memory is one chunk buffer plus the chunk being sealed. A full chunk is held back until more data
    arrives or finish() is called, because only then is it known whether it is the segment's last.
    Not thread-safe (its chain owns a zstd context): use one encoder from one thread at a time.

    hash_payload False: the caller hashes the original bytes itself (on another thread, alongside the
    sealing) and gives the MD5 to finish().
    """

    def __init__(
        self,
        ctx: ObjectContext,
        settings: TransformSettings,
        segment_no: int = 1,
        *,
        salt: bytes | None = None,
        object_start: bool = True,
        hash_payload: bool = True,
    ) -> None:
        if not 1 <= segment_no <= MAX_SEGMENT_NO:
            raise ValueError(f"segment_no {segment_no} is not within 1..{MAX_SEGMENT_NO}")
        self._segment_no = segment_no
        self._chunk_size = settings.chunk_size
        # The chunk buffer grows to the chunk size only as data arrives: a small object never pays for a
        # whole (up to 64 MiB) chunk of zeroed memory.
        self._view = memoryview(bytearray())
        self._fill = 0
        self._size = 0
        self._md5 = hashlib.md5(usedforsecurity=False) if hash_payload else None
        self._sizes: list[int] = []
        self._info: SegmentInfo | None = None
        # object_start False: a multipart part after the first, its data starting anywhere in the object.
        self._chain = UploadChain(ctx, settings, segment_no, salt=salt, object_start=object_start)

    @property
    def info(self) -> SegmentInfo:
        """The segment's manifest entry; available once finish() has returned."""
        if self._info is None:
            raise RuntimeError("SegmentEncoder.info is known only after finish()")
        return self._info

    @property
    def original_size(self) -> int:
        """Original bytes fed so far."""
        return self._size

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Take the next original bytes; returns the stored chunks they complete (often none)."""
        if self._info is not None:
            raise RuntimeError("SegmentEncoder.feed after finish")
        view = memoryview(data).cast("B")
        n = len(view)
        if not n:
            return []
        if self._size + n > MAX_SEGMENT_SIZE:
            raise EntityTooLarge(f"a single upload or part is at most {MAX_SEGMENT_SIZE} bytes")
        if self._md5 is not None:
            self._md5.update(view)
        self._size += n
        size = self._chunk_size
        out: list[bytes] = []
        pos = 0
        while pos < n:
            if self._fill == size:
                # More data follows, so the held-back chunk is not the last one.
                out.append(self._seal(self._view, last=False))
                self._fill = 0
            if self._fill == 0 and n - pos > size:
                # A whole chunk with more after it: seal straight from the caller's buffer, no copy.
                out.append(self._seal(view[pos : pos + size], last=False))
                pos += size
                continue
            take = min(size - self._fill, n - pos)
            if self._fill + take > len(self._view):
                self._grow(self._fill + take)
            self._view[self._fill : self._fill + take] = view[pos : pos + take]
            self._fill += take
            pos += take
        return out

    def finish(self, payload_md5: bytes | None = None) -> list[bytes]:
        """Seal what is left as the last chunk; afterwards .info is set.

        payload_md5: the MD5 of everything fed, from a caller that hashes it (hash_payload False).
        """
        if self._info is not None:
            raise RuntimeError("SegmentEncoder.finish called twice")
        if self._md5 is not None and payload_md5 is None:
            md5 = self._md5.digest()
        elif self._md5 is None and payload_md5 is not None:
            md5 = payload_md5
        else:
            raise ValueError("payload_md5 is given exactly when the encoder does not hash the payload")
        out: list[bytes] = []
        if self._fill:
            out.append(self._seal(self._view[: self._fill], last=True))
            self._fill = 0
        seal = self._chain.seal_stage
        self._info = SegmentInfo(
            segment_no=self._segment_no,
            salt=seal.salt,
            original_size=self._size,
            md5=md5,
            stored_sizes=tuple(self._sizes),
            compressed=self._chain.compressed,
            crc32c=seal.crcs,
        )
        self._view.release()
        return out

    def _grow(self, needed: int) -> None:
        capacity = min(self._chunk_size, max(needed, 2 * len(self._view), _MIN_BUFFER))
        bigger = bytearray(capacity)
        bigger[: self._fill] = self._view[: self._fill]
        self._view.release()
        self._view = memoryview(bigger)

    def _seal(self, chunk: memoryview, last: bool) -> bytes:
        stored = self._chain.seal(chunk, len(self._sizes), last)
        self._sizes.append(len(stored))
        return stored
