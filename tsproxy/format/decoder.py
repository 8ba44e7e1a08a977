"""Reading chunks back: authenticate (AES-GCM tag or CRC32C), then inflate the chunks stored compressed."""

from __future__ import annotations

import zstandard
from awscrt.checksums import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tsproxy.errors import IntegrityError

from .context import ObjectContext, aad_prefix, chunk_aad, chunk_nonce
from .index import ChunkRef
from .manifest import Manifest


class ChunkDecoder:
    """Turns stored chunks of one object back into original bytes, verifying each.

    Not thread-safe (it owns a zstd context): one per thread or per reader.
    """

    def __init__(self, manifest: Manifest, ctx: ObjectContext) -> None:
        if ctx.object_id != manifest.object_id or ctx.encrypted != manifest.encrypted:
            raise ValueError("the context is not this manifest's object")
        self._aead = AESGCM(ctx.dek) if ctx.dek is not None else None
        # Per segment: (salt, associated-data prefix, chunk CRC32Cs).
        self._segments = {
            s.segment_no: (s.salt, aad_prefix(ctx.object_id, s.segment_no), s.crc32c)
            for s in manifest.segments
        }
        self._decompressor = zstandard.ZstdDecompressor()

    def decode(self, ref: ChunkRef, stored: bytes | bytearray | memoryview) -> bytes:
        """The original bytes of the chunk ref; IntegrityError on any mismatch, never unverified bytes."""
        view = memoryview(stored).cast("B")
        where = f"chunk {ref.chunk_no} of segment {ref.segment_no}"
        if len(view) != ref.stored_len:
            raise IntegrityError(f"{where}: {len(view)} stored bytes, expected {ref.stored_len}")
        segment = self._segments.get(ref.segment_no)
        if segment is None:
            raise IntegrityError(f"{where}: no such segment in the manifest")
        salt, prefix, crcs = segment
        payload: bytes | memoryview
        if self._aead is not None:
            try:
                payload = self._aead.decrypt(
                    chunk_nonce(salt, ref.chunk_no), view, chunk_aad(prefix, ref.chunk_no, ref.last)
                )
            except InvalidTag:
                raise IntegrityError(
                    f"{where}: authentication failed (tampered, moved or truncated)"
                ) from None
        else:
            if ref.chunk_no >= len(crcs) or crc32c(view) != crcs[ref.chunk_no]:
                raise IntegrityError(f"{where}: CRC32C mismatch (corrupted or tampered)")
            payload = view
        if len(payload) == ref.original_len:
            return payload if isinstance(payload, bytes) else bytes(payload)
        if len(payload) > ref.original_len:
            raise IntegrityError(f"{where}: longer than its original length")
        # Check the declared size before inflating, so a hostile frame cannot ask for a huge buffer.
        try:
            declared = zstandard.frame_content_size(payload)
        except zstandard.ZstdError:
            raise IntegrityError(f"{where}: not a zstd frame") from None
        if declared != ref.original_len:
            raise IntegrityError(
                f"{where}: zstd frame declares {declared} bytes, expected {ref.original_len}"
            )
        try:
            data = self._decompressor.decompress(payload, max_output_size=ref.original_len)
        except zstandard.ZstdError as e:
            raise IntegrityError(f"{where}: zstd: {e}") from None
        if len(data) != ref.original_len:
            raise IntegrityError(f"{where}: decompressed to {len(data)} bytes, expected {ref.original_len}")
        return data
