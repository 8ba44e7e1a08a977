"""Bounds-checked primitives of the binary manifest: unsigned LEB128 varints, fixed ints, strings.

Everything a reader decodes may come from a tampered object, so the reader checks every length against
what is left before it slices, and reports any violation as an IntegrityError.
"""

from __future__ import annotations

import struct

from tsproxy.errors import IntegrityError

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def varint(value: int) -> bytes:
    """Unsigned LEB128: seven bits a byte, least significant group first, high bit set on all but the last."""
    if value < 0:
        raise ValueError("varint: negative value")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    """Bytes that varint(value) takes."""
    return max(1, (value.bit_length() + 6) // 7)


class Writer:
    """Appends manifest fields to one growing buffer."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def u8(self, value: int) -> None:
        self.buf.append(value)

    def u16(self, value: int) -> None:
        self.buf += _U16.pack(value)

    def u32(self, value: int) -> None:
        self.buf += _U32.pack(value)

    def varint(self, value: int) -> None:
        self.buf += varint(value)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buf += data

    def blob(self, data: bytes) -> None:
        """Length-prefixed bytes."""
        self.varint(len(data))
        self.buf += data

    def text(self, value: str) -> None:
        """Length-prefixed UTF-8."""
        self.blob(value.encode("utf-8"))

    def mapping(self, values: dict[str, str]) -> None:
        """A count, then key and value texts, in sorted key order so equal maps encode equally."""
        self.varint(len(values))
        for key in sorted(values):
            self.text(key)
            self.text(values[key])


class Reader:
    """Reads manifest fields from a memoryview, refusing to run past its end."""

    def __init__(self, data: bytes | bytearray | memoryview, what: str = "manifest") -> None:
        self.view = memoryview(data).cast("B")
        self.pos = 0
        self.what = what

    def remaining(self) -> int:
        return len(self.view) - self.pos

    def fail(self, why: str) -> IntegrityError:
        return IntegrityError(f"{self.what}: {why} at byte {self.pos}")

    def take(self, n: int) -> memoryview:
        if n < 0 or n > len(self.view) - self.pos:
            raise self.fail(f"truncated (needs {n} bytes, {len(self.view) - self.pos} left)")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        if self.pos >= len(self.view):
            raise self.fail("truncated")
        value = self.view[self.pos]
        self.pos += 1
        return value

    def u16(self) -> int:
        value: int = _U16.unpack(self.take(2))[0]
        return value

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def varint(self, limit: int = 1 << 63) -> int:
        """A varint no larger than limit (checked, so a hostile length cannot ask for a huge allocation)."""
        result = 0
        shift = 0
        while True:
            byte = self.u8()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise self.fail("varint too long")
        if result > limit:
            raise self.fail(f"value {result} exceeds {limit}")
        return result

    def blob(self) -> bytes:
        return bytes(self.take(self.varint(self.remaining())))

    def text(self) -> str:
        raw = self.take(self.varint(self.remaining()))
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise self.fail("invalid UTF-8") from None

    def mapping(self) -> dict[str, str]:
        count = self.varint(self.remaining() // 2)
        out: dict[str, str] = {}
        for _ in range(count):
            key = self.text()
            if key in out:
                raise self.fail(f"duplicate key {key!r}")
            out[key] = self.text()
        return out

    def end(self) -> None:
        if self.pos != len(self.view):
            raise self.fail(f"{len(self.view) - self.pos} unexpected trailing bytes")
