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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    # MD5 of the stored chunks one after another, known to their writer only (never recorded, None when
    # read back): the Content-MD5 of a backend part that holds exactly them.
    stored_md5: bytes | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.segment_no <= MAX_SEGMENT_NO:
            raise ValueError(f"segment_no {self.segment_no} is not within 1..{MAX_SEGMENT_NO}")
        if len(self.salt) not in (0, SALT_SIZE):
            raise ValueError("salt must be 8 bytes (encrypted) or empty")
        if len(self.md5) != MD5_SIZE or (self.stored_md5 is not None and len(self.stored_md5) != MD5_SIZE):
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


@dataclass(frozen=True)
class ChunkCut:
    """A chunk cut from a segment's original bytes, ready to be sealed (on any thread), then recorded."""

    chunk_no: int
    data: memoryview  # the chunk's original bytes, which nothing writes to while the cut is alive
    last: bool


class SegmentEncoder:
    """Sans-IO streaming encoder of one segment: original bytes in, stored chunks out.

    Driven one of two ways:

    * from one thread, feed() and finish(), each returning the stored chunks it completed;
    * in stages, to seal a segment's chunks on several threads at once: cut() the chunks in order (and
      cut_last() at the end), seal() each on any thread, record() the stored chunks in chunk order, and
      conclude(). cut() keeps views of the batches it is given instead of copying them: they must be
      immutable (bytes). seal() may run on several threads at once beside any other call, and record()
      beside cut() (they share nothing); otherwise one call at a time.

    A full chunk is held back until more data arrives or the input ends, because only then is it known
    whether it is the segment's last. Fed, memory is one chunk buffer plus the chunk being sealed; cut,
    the chunks cut and not yet sealed are the caller's to bound.

    hash_payload False: the caller hashes the original bytes itself (on another thread, alongside the
    sealing) and gives the MD5 to finish() or conclude().
    stored_md5: a hashlib MD5 object the stored chunks are fed to as they are recorded, in order; its
    digest at the segment's end becomes SegmentInfo.stored_md5 (the caller may go on feeding it what it
    stores after the chunks).
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
        stored_md5: Any = None,
    ) -> None:
        if not 1 <= segment_no <= MAX_SEGMENT_NO:
            raise ValueError(f"segment_no {segment_no} is not within 1..{MAX_SEGMENT_NO}")
        self._segment_no = segment_no
        self._chunk_size = settings.chunk_size
        # The chunk buffer grows to the chunk size only as data arrives: a small object never pays for a
        # whole (up to 64 MiB) chunk of zeroed memory.
        self._view = memoryview(bytearray())
        self._fill = 0
        # A whole chunk whose last-ness is not known yet, when it is not in the buffer (cut: a view of
        # a caller's batch, or a buffer handed over to it).
        self._held: memoryview | None = None
        # (cut) The start of a chunk at the end of a batch, kept as a view of it: copied into the buffer
        # only if the chunk goes on in the next batch, never if the input ends first.
        self._start: memoryview | None = None
        self._size = 0
        self._cuts = 0
        self._ended = False
        self._keeps: bool | None = None  # cut (True) or fed (False): one or the other, never both
        self._md5 = hashlib.md5(usedforsecurity=False) if hash_payload else None
        self._stored_md5 = stored_md5
        self._sizes: list[int] = []
        self._info: SegmentInfo | None = None
        # object_start False: a multipart part after the first, its data starting anywhere in the object.
        self._chain = UploadChain(ctx, settings, segment_no, salt=salt, object_start=object_start)

    def stored_size_if_raw(self, original_size: int) -> int | None:
        """The stored size of a segment of `original_size` bytes whose compression decision is no: every
        chunk stored as it is, plus the seal's overhead. None while the decision is not made, or when it
        is yes (compressed chunks have sizes known only once sealed)."""
        if self._chain.decision is not False:
            return None
        chunks = -(-original_size // self._chunk_size)
        return original_size + chunks * self._chain.stages.overhead

    @property
    def info(self) -> SegmentInfo:
        """The segment's manifest entry; available once finish() (or conclude()) has returned."""
        if self._info is None:
            raise RuntimeError("SegmentEncoder.info is known only after finish()")
        return self._info

    @property
    def original_size(self) -> int:
        """Original bytes fed so far."""
        return self._size

    # -- one thread ------------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Take the next original bytes; returns the stored chunks they complete (often none).

        The caller may reuse `data` once this returns: nothing of it is kept.
        """
        out: list[bytes] = []
        self._take(memoryview(data).cast("B"), lambda cut: out.append(self._seal_and_record(cut)), False)
        return out

    def finish(self, payload_md5: bytes | None = None) -> list[bytes]:
        """Seal what is left as the last chunk; afterwards .info is set.

        payload_md5: the MD5 of everything fed, from a caller that hashes it (hash_payload False).
        """
        if self._info is not None:
            raise RuntimeError("SegmentEncoder.finish called twice")
        self._payload_md5(payload_md5)  # a wrong call fails before anything is sealed
        out = [self._seal_and_record(cut) for cut in self.cut_last()]
        self.conclude(payload_md5)
        return out

    # -- in stages -------------------------------------------------------------------------------

    def cut(self, batch: bytes) -> list[ChunkCut]:
        """Take the next original bytes; returns the chunks they complete (often none), views of `batch`
        where a chunk lies within it, else of a buffer that each cut chunk takes with it."""
        if not isinstance(batch, bytes):
            raise TypeError("cut() keeps views of its batches: give it bytes")
        out: list[ChunkCut] = []
        self._take(memoryview(batch), out.append, True)
        return out

    def cut_last(self) -> list[ChunkCut]:
        """The input has ended: the segment's last chunk (none for an empty segment)."""
        if self._ended:
            raise RuntimeError("SegmentEncoder input already ended")
        self._ended = True
        if self._held is not None:
            held, self._held = self._held, None
            return [self._cut(held, last=True)]
        if self._start is not None:
            start, self._start = self._start, None
            return [self._cut(start, last=True)]
        if self._fill:
            rest, self._view, self._fill = self._view[: self._fill], memoryview(bytearray()), 0
            return [self._cut(rest, last=True)]
        return []

    def seal(self, cut: ChunkCut) -> bytes:
        """The stored bytes of a cut chunk. Safe on several threads at once, for chunks in any order."""
        return self._chain.seal(cut.data, cut.chunk_no, cut.last)

    def record(self, chunk_no: int, stored: bytes) -> None:
        """Note a sealed chunk (by its cut's chunk_no); chunks are recorded in order (and fed to stored_md5
        here). Only the number: a record waiting to be made holds no view of the original bytes."""
        if chunk_no != len(self._sizes):
            raise RuntimeError(f"chunk {chunk_no} recorded out of order (next is {len(self._sizes)})")
        self._sizes.append(len(stored))
        if self._stored_md5 is not None:
            self._stored_md5.update(stored)

    def conclude(self, payload_md5: bytes | None = None) -> SegmentInfo:
        """The segment's entry, once its last chunk is cut and every chunk recorded."""
        if not self._ended or len(self._sizes) != self._cuts:
            raise RuntimeError("SegmentEncoder.conclude before every chunk is cut and recorded")
        seal = self._chain.seal_stage
        self._info = SegmentInfo(
            segment_no=self._segment_no,
            salt=seal.salt,
            original_size=self._size,
            md5=self._payload_md5(payload_md5),
            stored_sizes=tuple(self._sizes),
            compressed=self._chain.compressed,
            crc32c=seal.crcs,
            stored_md5=None if self._stored_md5 is None else self._stored_md5.digest(),
        )
        return self._info

    # -- the cutting -----------------------------------------------------------------------------

    def _payload_md5(self, given: bytes | None) -> bytes:
        if self._md5 is not None and given is None:
            return self._md5.digest()
        if self._md5 is None and given is not None:
            return given
        raise ValueError("payload_md5 is given exactly when the encoder does not hash the payload")

    def _take(self, view: memoryview, emit: Callable[[ChunkCut], None], keep: bool) -> None:
        """Cut `view` into chunks, each emitted once it is known not to be the last.

        keep: the bytes of `view` are immutable and may be kept (cut); else (feed) `emit` seals each
        chunk before this returns, so the buffer is reused and nothing of `view` outlives the call.
        """
        if self._ended:
            raise RuntimeError("SegmentEncoder fed after its input ended")
        if self._keeps is not None and self._keeps != keep:
            raise RuntimeError("a SegmentEncoder is either fed or cut, not both")
        self._keeps = keep
        n = len(view)
        if not n:
            return
        if self._size + n > MAX_SEGMENT_SIZE:
            raise EntityTooLarge(f"a single upload or part is at most {MAX_SEGMENT_SIZE} bytes")
        if self._md5 is not None:
            self._md5.update(view)
        self._size += n
        size = self._chunk_size
        # More data has arrived, so a chunk held back is not the last one.
        if self._held is not None:
            held, self._held = self._held, None
            emit(self._cut(held, last=False))
        elif self._fill == size:  # (feed) held in the buffer
            emit(self._cut(self._view, last=False))
            self._fill = 0
        if self._start is not None:  # the chunk begun in the last batch goes on in this one
            start, self._start = self._start, None
            self._append(start)
        pos = 0
        while pos < n:
            if self._fill == 0 and (n - pos > size or (keep and n - pos == size)):
                # A whole chunk of the caller's bytes: cut (or held) as a view of them, no copy.
                chunk = view[pos : pos + size]
                pos += size
                if pos < n:
                    emit(self._cut(chunk, last=False))
                else:
                    self._held = chunk
                continue
            if keep and self._fill == 0:  # a chunk's start ends the batch
                self._start = view[pos:]
                return
            take = min(size - self._fill, n - pos)
            self._append(view[pos : pos + take])
            pos += take
            if self._fill < size:
                continue
            if keep:
                # The chunk takes the buffer with it; the next chunk gets a buffer of its own.
                chunk, self._view, self._fill = self._view, memoryview(bytearray()), 0
                if pos < n:
                    emit(self._cut(chunk, last=False))
                else:
                    self._held = chunk
            elif pos < n:
                emit(self._cut(self._view, last=False))
                self._fill = 0

    def _cut(self, data: memoryview, last: bool) -> ChunkCut:
        if self._cuts == 0:
            self._chain.decide(data)  # before any chunk of the segment is sealed
        cut = ChunkCut(self._cuts, data, last)
        self._cuts += 1
        return cut

    def _append(self, data: memoryview) -> None:
        if self._fill + len(data) > len(self._view):
            self._grow(self._fill + len(data))
        self._view[self._fill : self._fill + len(data)] = data
        self._fill += len(data)

    def _grow(self, needed: int) -> None:
        # A segment that filled one chunk is likely to fill the next: its buffer is a whole one at once.
        floor = self._chunk_size if self._cuts else _MIN_BUFFER
        capacity = min(self._chunk_size, max(needed, 2 * len(self._view), floor))
        bigger = bytearray(capacity)
        bigger[: self._fill] = self._view[: self._fill]
        self._view.release()
        self._view = memoryview(bigger)

    def _seal_and_record(self, cut: ChunkCut) -> bytes:
        stored = self.seal(cut)
        self.record(cut.chunk_no, stored)
        return stored
