"""Decoding of `Content-Encoding: aws-chunked` request bodies, sans-IO.

Feed it the body's bytes as they arrive; it hands back the payload, in order, as views of what it was
fed. The framing, per chunk, is::

    <hex size>[;chunk-signature=<64 hex>]\\r\\n<size bytes>\\r\\n

ending with a chunk of size 0, then optional trailing headers (``name:value\\r\\n`` lines, e.g. a
checksum and, when signed, ``x-amz-trailer-signature``) and an empty line.

Signed bodies (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]``) chain a signature through every chunk,
starting from the request's own signature, and sign the trailer last. Payload is handed back before its
chunk's signature can be checked (a chunk can be large); a bad signature raises from `feed`, so the
caller must treat everything handed back as provisional until `finish` returns.

Memory is bounded: one framing line (at most `MAX_LINE` bytes) is buffered, payload never is.
"""

from __future__ import annotations

import hashlib
from enum import Enum, auto

from tsproxy import errors
from tsproxy.s3.checksums import Checksum
from tsproxy.s3.sigv4 import (
    SIGNED_STREAMING,
    STREAMING_SIGNED_TRAILER,
    AuthResult,
    chunk_string_to_sign,
    sign,
    signatures_equal,
    trailer_string_to_sign,
)

MAX_LINE = 4096  # a chunk header is ~90 bytes, a trailer line ~110; anything near this is not a client
MAX_TRAILERS = 8
MIN_CHUNK_SIZE = 8192  # S3's least size of every chunk but the last
_HEX = frozenset(b"0123456789abcdefABCDEF")
_SIGNATURE = b"chunk-signature="


class _State(Enum):
    SIZE = auto()  # reading a chunk-size line
    DATA = auto()  # inside a chunk's payload
    DATA_END = auto()  # the CRLF after a chunk's payload
    TRAILER = auto()  # trailing header lines after the final chunk
    DONE = auto()


class AwsChunkedDecoder:
    """Turns an aws-chunked body into its payload, checking framing, length, signatures and checksum.

    `decoded_length` is `x-amz-decoded-content-length` (None when absent); `trailer` the lower-case name
    from `x-amz-trailer`; with `checksum_algorithm` set, the decoder checksums the payload itself and
    compares it with that trailer (BadDigest on mismatch).
    """

    def __init__(
        self,
        auth: AuthResult,
        *,
        decoded_length: int | None,
        trailer: str | None,
        checksum_algorithm: str | None,
        min_chunk_size: int = MIN_CHUNK_SIZE,
    ) -> None:
        self._signed = auth.payload_mode in SIGNED_STREAMING
        self._trailer_signed = auth.payload_mode == STREAMING_SIGNED_TRAILER
        if self._signed and not auth.signing_key:
            raise errors.InvalidRequest("Signed aws-chunked payloads need a signed request.")
        self._auth = auth
        self._previous = auth.seed_signature
        self._decoded_length = decoded_length
        self._trailer = trailer.lower() if trailer else None
        self._checksum = Checksum(checksum_algorithm) if checksum_algorithm else None
        if self._checksum is not None and self._trailer is None:
            self._trailer = self._checksum.header
        self._state = _State.SIZE
        self._line = bytearray()
        self._remaining = 0
        self._chunk_signature = ""
        self._chunk_hash = hashlib.sha256()
        self._crlf_seen = 0
        self._received = 0
        self._min_chunk_size = min_chunk_size
        self._last_size = 0  # of the chunk before the one being read
        self._chunks = 0
        self._trailers: dict[str, str] = {}
        self._trailer_signature: str | None = None
        self._trailer_lines = 0

    @property
    def received(self) -> int:
        """Payload bytes decoded so far."""
        return self._received

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
        """Decode the next bytes of the body; return the payload pieces they complete, in order.

        Pieces are views of `data` (no copies): use them before changing a buffer that was fed.
        """
        view = memoryview(data).cast("B")
        raw = (
            data if isinstance(data, (bytes, bytearray)) else bytes(view)
        )  # for find(); views get copied once
        out: list[bytes | memoryview] = []
        pos, end = 0, len(view)
        while pos < end:
            state = self._state
            if state is _State.DATA:
                take = min(self._remaining, end - pos)
                piece = view[pos : pos + take]
                self._payload(piece)
                out.append(piece)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._end_of_chunk_data()
            elif state is _State.DATA_END:
                while pos < end and self._crlf_seen < 2:
                    if raw[pos] != b"\r\n"[self._crlf_seen]:
                        raise errors.InvalidRequest(
                            "A chunk's data is not followed by CRLF (chunk longer than its size?)."
                        )
                    pos += 1
                    self._crlf_seen += 1
                if self._crlf_seen == 2:
                    self._state = _State.SIZE
            elif state is _State.DONE:
                raise errors.InvalidRequest("The aws-chunked body continues after its final chunk.")
            else:
                newline = raw.find(b"\n", pos)
                stop = end if newline < 0 else newline + 1
                if len(self._line) + (stop - pos) > MAX_LINE:
                    raise errors.InvalidRequest("An aws-chunked framing line is too long.")
                self._line += view[pos:stop]
                pos = stop
                if newline >= 0:
                    line = bytes(self._line)
                    self._line.clear()
                    self._on_line(line)
        return out

    def finish(self) -> dict[str, str]:
        """Declare the body ended; return the trailing headers (lower-case names, without the signature).

        Raises IncompleteBody if the final chunk never came.
        """
        if self._state is _State.TRAILER and not self._line:
            # Tolerate a body that stops right after its last trailer line, without the empty line.
            self._end_of_trailers()
        if self._state is not _State.DONE:
            raise errors.IncompleteBody("The aws-chunked body ended before its final chunk.")
        return dict(self._trailers)

    # -- internals ---------------------------------------------------------------------------------

    def _payload(self, piece: memoryview) -> None:
        self._received += len(piece)
        if self._signed:
            self._chunk_hash.update(piece)
        if self._checksum is not None:
            self._checksum.update(piece)

    def _on_line(self, line: bytes) -> None:
        if not line.endswith(b"\r\n"):
            raise errors.InvalidRequest("An aws-chunked framing line does not end in CRLF.")
        content = line[:-2]
        if self._state is _State.SIZE:
            self._on_size_line(content)
        elif content:
            self._on_trailer_line(content)
        else:
            self._end_of_trailers()

    def _on_size_line(self, content: bytes) -> None:
        head, _, extensions = content.partition(b";")
        if not head or len(head) > 16 or not _HEX.issuperset(head):
            raise errors.InvalidRequest(f"Invalid aws-chunked chunk size {head[:32]!r}.")
        size = int(head, 16)
        signature = None
        for ext in extensions.split(b";") if extensions else []:
            if ext.startswith(_SIGNATURE):
                signature = ext[len(_SIGNATURE) :].decode("ascii", "replace")
        if self._signed:
            if signature is None:
                raise errors.SignatureDoesNotMatch(
                    "A chunk of a signed aws-chunked body has no chunk-signature."
                )
            self._chunk_signature = signature
            self._chunk_hash = hashlib.sha256()
        if self._decoded_length is not None and self._received + size > self._decoded_length:
            raise errors.InvalidRequest(
                "The aws-chunked body holds more than x-amz-decoded-content-length bytes."
            )
        if size:
            if 0 < self._last_size < self._min_chunk_size:
                # A short chunk followed by another was not the last: S3 refuses it, and 1-byte chunks
                # would cost a framing line (and a signature) per byte.
                raise errors.InvalidChunkSizeError(Chunk=str(self._chunks), BadChunkSize=str(self._last_size))
            self._last_size = size
            self._chunks += 1
            self._remaining = size
            self._state = _State.DATA
            return
        self._end_of_chunk_data()
        if self._decoded_length is not None and self._received != self._decoded_length:
            raise errors.IncompleteBody(
                f"The aws-chunked body holds {self._received} bytes; x-amz-decoded-content-length says "
                f"{self._decoded_length}."
            )
        self._state = _State.TRAILER

    def _end_of_chunk_data(self) -> None:
        if self._signed:
            auth = self._auth
            expected = sign(
                auth.signing_key,
                chunk_string_to_sign(auth.amz_date, auth.scope, self._previous, self._chunk_hash.hexdigest()),
            )
            if not signatures_equal(expected, self._chunk_signature):
                raise errors.SignatureDoesNotMatch(
                    "The chunk signature we calculated does not match the signature you provided."
                )
            self._previous = expected
        self._crlf_seen = 0
        self._state = _State.DATA_END

    def _on_trailer_line(self, content: bytes) -> None:
        self._trailer_lines += 1
        if self._trailer_lines > MAX_TRAILERS:
            raise errors.InvalidRequest("Too many trailing headers in the aws-chunked body.")
        name_b, colon, value_b = content.partition(b":")
        name = name_b.strip().lower().decode("ascii", "replace")
        value = value_b.strip().decode("utf-8", "replace")
        if not colon or not name:
            raise errors.InvalidRequest("A trailing header of the aws-chunked body is malformed.")
        if name == "x-amz-trailer-signature":
            if not self._trailer_signed:
                raise errors.InvalidRequest("A trailer signature was sent for an unsigned trailer.")
            self._trailer_signature = value
            return
        if name != self._trailer:
            raise errors.InvalidRequest(f"The trailing header {name} was not declared in x-amz-trailer.")
        if name in self._trailers:
            raise errors.InvalidRequest(f"The trailing header {name} was sent twice.")
        self._trailers[name] = value

    def _end_of_trailers(self) -> None:
        if self._trailer_signed:
            if self._trailer_signature is None:
                raise errors.SignatureDoesNotMatch("The trailer of a signed aws-chunked body is not signed.")
            auth = self._auth
            sts = trailer_string_to_sign(auth.amz_date, auth.scope, self._previous, self._trailers.items())
            if not signatures_equal(sign(auth.signing_key, sts), self._trailer_signature):
                raise errors.SignatureDoesNotMatch(
                    "The trailer signature we calculated does not match the signature you provided."
                )
        if self._trailer is not None and self._trailer not in self._trailers:
            raise errors.InvalidRequest(f"The {self._trailer} trailer was declared but not sent.")
        if self._checksum is not None:
            claimed = self._trailers.get(self._checksum.header)
            if claimed != self._checksum.b64digest():
                raise errors.BadDigest(
                    f"The {self._checksum.algorithm} you specified did not match the calculated checksum."
                )
        self._state = _State.DONE
