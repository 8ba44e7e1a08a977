"""Per-object secrets and ids, and what derives from them: chunk nonces, associated data, manifest key.

Chunk nonce (12 bytes)  = salt (8, random per segment upload attempt) || chunk_no (u32 BE)
Associated data (29)    = object_id (16) || segment_no (u32 BE) || chunk_no (u32 BE) || last (u8, 1 or 0)
Manifest key (32)       = HKDF-SHA256(DEK, salt = none, info = "tsproxy manifest v1")
Upload ticket key (32)  = HKDF-SHA256(DEK, salt = none, info = "tsproxy upload ticket v1")
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tsproxy.errors import ConfigError, FormatError, IntegrityError, KeyNotFound

from .keyring import KeyRing
from .settings import TransformSettings
from .wire import Reader, Writer

OBJECT_ID_SIZE = 16
DEK_SIZE = 32
SALT_SIZE = 8
TAG_SIZE = 16
MANIFEST_MAC_SIZE = 16
MANIFEST_KEY_INFO = b"tsproxy manifest v1"
TICKET_KEY_INFO = b"tsproxy upload ticket v1"
TICKET_MAC_SIZE = 16
MAX_SEGMENT_NO = 10_000

_STATE_VERSION = 1
_CHUNK_TAIL = struct.Struct(">IB")


def chunk_nonce(salt: bytes, chunk_no: int) -> bytes:
    """The AES-GCM nonce of a chunk: unique under one DEK as long as salts are."""
    return salt + chunk_no.to_bytes(4, "big")


def aad_prefix(object_id: bytes, segment_no: int) -> bytes:
    """The part of a chunk's associated data shared by a whole segment."""
    return object_id + segment_no.to_bytes(4, "big")


def chunk_aad(prefix: bytes, chunk_no: int, last: bool) -> bytes:
    """Associated data binding a chunk to its object, segment, position and last-ness."""
    return prefix + _CHUNK_TAIL.pack(chunk_no, last)


@dataclass(frozen=True)
class ObjectContext:
    """An object's id and, when encrypted, its DEK and the DEK wrapped by a KEK.

    The plain DEK lives only in memory; to_state() persists the wrapped one.
    """

    object_id: bytes
    dek: bytes | None = None
    kek_id: str | None = None
    wrapped_dek: bytes | None = None

    def __post_init__(self) -> None:
        if len(self.object_id) != OBJECT_ID_SIZE:
            raise ValueError("object_id must be 16 bytes")
        if self.dek is not None and len(self.dek) != DEK_SIZE:
            raise ValueError("a DEK is 32 bytes")
        if (self.dek is None) != (self.kek_id is None) or (self.dek is None) != (self.wrapped_dek is None):
            raise ValueError("dek, kek_id and wrapped_dek go together")

    def __repr__(self) -> str:
        # Never print the DEK, not even by accident in a log line or a test failure.
        return (
            f"ObjectContext(object_id={self.object_id.hex()}, encrypted={self.encrypted}, "
            f"kek_id={self.kek_id!r})"
        )

    @property
    def encrypted(self) -> bool:
        return self.dek is not None

    @classmethod
    def new(cls, settings: TransformSettings, keyring: KeyRing | None) -> ObjectContext:
        """Fresh random object id and, with encryption on, a fresh DEK wrapped by the active KEK."""
        object_id = os.urandom(OBJECT_ID_SIZE)
        if not settings.encryption:
            return cls(object_id)
        if keyring is None:
            raise ConfigError("encryption is on but no key ring is loaded")
        dek = os.urandom(DEK_SIZE)
        kek_id, wrapped = keyring.wrap(dek)
        return cls(object_id, dek, kek_id, wrapped)

    def to_state(self) -> bytes:
        """Compact bytes for a multipart upload's persisted state: the wrapped DEK, never the plain one."""
        w = Writer()
        w.u8(_STATE_VERSION)
        w.raw(self.object_id)
        w.u8(1 if self.encrypted else 0)
        if self.kek_id is not None and self.wrapped_dek is not None:
            w.text(self.kek_id)
            w.blob(self.wrapped_dek)
        return bytes(w.buf)

    @classmethod
    def from_state(cls, state: bytes, keyring: KeyRing | None) -> ObjectContext:
        """Rebuild a context from to_state() bytes, unwrapping the DEK with the key ring."""
        r = Reader(state, "object state")
        if r.u8() != _STATE_VERSION:
            raise FormatError("object state: unknown version")
        object_id = bytes(r.take(OBJECT_ID_SIZE))
        encrypted = r.u8()
        if encrypted not in (0, 1):
            raise r.fail("bad encryption flag")
        if not encrypted:
            r.end()
            return cls(object_id)
        kek_id = r.text()
        wrapped = r.blob()
        r.end()
        return cls.unwrapped(object_id, kek_id, wrapped, keyring)

    @classmethod
    def unwrapped(
        cls, object_id: bytes, kek_id: str, wrapped: bytes, keyring: KeyRing | None
    ) -> ObjectContext:
        """A context for an encrypted object, its DEK unwrapped by kek_id from the ring."""
        if keyring is None:
            raise KeyNotFound(f"object is encrypted with KEK {kek_id!r} but no key ring is loaded")
        dek = keyring.unwrap(kek_id, wrapped)
        if len(dek) != DEK_SIZE:
            raise IntegrityError("unwrapped DEK has the wrong length")
        return cls(object_id, dek, kek_id, wrapped)

    def manifest_key(self) -> bytes:
        """The HMAC key authenticating the manifest, derived from the DEK."""
        if self.dek is None:
            raise ValueError("an unencrypted object has no manifest key")
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=MANIFEST_KEY_INFO).derive(self.dek)

    def manifest_mac(self, data: bytes | bytearray | memoryview) -> bytes:
        """HMAC-SHA256 of the manifest bytes, truncated to 16 bytes."""
        return hmac.new(self.manifest_key(), data, hashlib.sha256).digest()[:MANIFEST_MAC_SIZE]

    def ticket_mac(self, message: bytes | bytearray | memoryview) -> bytes:
        """HMAC-SHA256 of a multipart upload's ticket (service.uploads.tickets), truncated to 16 bytes,
        under a key of its own derived from the DEK: a client holding the upload id can read the ticket,
        and only the holder of the DEK can make one."""
        if self.dek is None:
            raise ValueError("an unencrypted object has no ticket key")
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=TICKET_KEY_INFO).derive(self.dek)
        return hmac.new(key, message, hashlib.sha256).digest()[:TICKET_MAC_SIZE]
