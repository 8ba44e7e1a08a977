"""The key ring: named key-encryption keys (KEKs), one active, kept in a JSON file.

New objects get their DEK wrapped by the active KEK; an object names its KEK by id, so older objects stay
readable for as long as their KEK stays on the ring. Two kinds of KEK:

* ``aes-256-kw``: a 256-bit key, DEKs wrapped with AES key wrap (RFC 3394), 40 bytes each.
* ``rsa-oaep-sha256``: an RSA private key of at least 3072 bits, DEKs encrypted with RSA-OAEP (SHA-256,
  MGF1-SHA-256), one modulus-sized block each.

File layout (mode 0600, written atomically)::

    {"tsproxy_key_ring": 1, "active": "<id>",
     "keys": [{"id": "<id>", "kind": "aes-256-kw", "created": "2026-01-31T12:00:00Z",
               "key": "<base64 of the raw key, or of the PKCS#8 DER private key>"}]}
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidKey
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap

from tsproxy.durable import fsync_dir
from tsproxy.errors import ConfigError, IntegrityError, KeyNotFound, KeyRingError

AES_KW = "aes-256-kw"
RSA_OAEP = "rsa-oaep-sha256"
KINDS = (AES_KW, RSA_OAEP)
RSA_BITS = 3072
FILE_VERSION = 1
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class InsecureKeyRing(KeyRingError, ConfigError):
    """The key ring file can be read or written by users other than its owner (see `check_private`)."""


def check_private(path: str | os.PathLike[str]) -> None:
    """Refuse a key ring file that group or others may read or write, the way PostgreSQL refuses its key.

    Allowed: no access for group or others (0600, 0400), or, for a file owned by root, read access for
    its group (0640, 0440) — what a Kubernetes Secret volume with an fsGroup gives a non-root container.
    The file is stat()ed through symlinks, so a Secret volume's `..data` links are judged by the file
    they lead to. Raises InsecureKeyRing in one line naming the file and its mode; a missing file is
    left to `KeyRing.load` to report, and so is a path that is not a regular file.
    """
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        return  # not a file at all: `KeyRing.load` says so
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077 or (st.st_uid == 0 and not mode & 0o037):
        return
    raise InsecureKeyRing(
        f"key ring {os.fspath(path)}: mode {mode:04o} lets group or others access it; "
        "chmod 600 it (0640 owned by root also passes), or set allow_insecure_key_ring to accept it"
    )


def _oaep() -> padding.OAEP:
    return padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)


@dataclass(frozen=True)
class _Kek:
    key_id: str
    kind: str
    created: str
    material: bytes = field(repr=False)  # raw AES key, or PKCS#8 DER of the RSA private key
    rsa_key: rsa.RSAPrivateKey | None = field(default=None, repr=False)

    @classmethod
    def generate(cls, kind: str, key_id: str) -> _Kek:
        created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if kind == AES_KW:
            return cls(key_id, kind, created, secrets.token_bytes(32))
        if kind == RSA_OAEP:
            private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
            der = private.private_bytes(
                serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            return cls(key_id, kind, created, der, private)
        raise KeyRingError(f"key ring: unknown key kind (known: {', '.join(KINDS)})")

    @classmethod
    def from_json(cls, entry: Any, where: str) -> _Kek:
        if not isinstance(entry, dict):
            raise KeyRingError(f"{where}: each key must be an object")
        fields = {}
        for name in ("id", "kind", "created", "key"):
            value = entry.get(name)
            if not isinstance(value, str):
                raise KeyRingError(f"{where}: key field {name!r} missing or not a string")
            fields[name] = value
        key_id, kind = fields["id"], fields["kind"]
        _check_id(key_id, where)
        try:
            material = base64.b64decode(fields["key"], validate=True)
        except binascii.Error:
            raise KeyRingError(f"{where}: key {key_id!r}: 'key' is not valid base64") from None
        if kind == AES_KW:
            if len(material) != 32:
                raise KeyRingError(
                    f"{where}: key {key_id!r}: an {AES_KW} key must be 32 bytes, not {len(material)}"
                )
            return cls(key_id, kind, fields["created"], material)
        if kind == RSA_OAEP:
            try:
                private = serialization.load_der_private_key(material, password=None)
            except (ValueError, TypeError):
                raise KeyRingError(f"{where}: key {key_id!r}: not a PKCS#8 DER private key") from None
            if not isinstance(private, rsa.RSAPrivateKey) or private.key_size < RSA_BITS:
                raise KeyRingError(f"{where}: key {key_id!r}: must be an RSA key of at least {RSA_BITS} bits")
            return cls(key_id, kind, fields["created"], material, private)
        # The value is not repeated: a field holding something else (key material pasted in the wrong
        # place) must not reach a log through the error that refuses it.
        raise KeyRingError(f"{where}: key {key_id!r}: unknown kind (known: {', '.join(KINDS)})")

    def to_json(self) -> dict[str, str]:
        return {
            "id": self.key_id,
            "kind": self.kind,
            "created": self.created,
            "key": base64.b64encode(self.material).decode("ascii"),
        }

    def wrap(self, dek: bytes) -> bytes:
        if self.rsa_key is not None:
            return self.rsa_key.public_key().encrypt(dek, _oaep())
        return aes_key_wrap(self.material, dek)

    def unwrap(self, wrapped: bytes) -> bytes:
        try:
            if self.rsa_key is not None:
                return self.rsa_key.decrypt(wrapped, _oaep())
            return aes_key_unwrap(self.material, wrapped)
        except (InvalidUnwrap, InvalidKey, ValueError):
            raise IntegrityError(f"wrapped DEK does not open with KEK {self.key_id!r}") from None


def _check_id(key_id: str, where: str = "key ring") -> None:
    if not _ID.match(key_id):
        # Not repeated in the message: it may be key material pasted into the wrong field.
        raise KeyRingError(
            f"{where}: a key id must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


class KeyRing:
    """Named KEKs, one of them active. Reading methods are safe to call from several threads."""

    def __init__(self, keys: list[_Kek], active: str) -> None:
        self._keys = {k.key_id: k for k in keys}
        if active not in self._keys:
            raise KeyRingError(f"key ring: active key {active!r} is not on the ring")
        self._active = active

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyRing:
        """Read a key ring file; KeyRingError says what is wrong with it, never the key material."""
        where = f"key ring {os.fspath(path)}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeyRingError(f"{where}: no such file (create one with `tsproxy keys init`)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise KeyRingError(f"{where}: cannot read: {e.__class__.__name__}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise KeyRingError(f"{where}: not valid JSON (line {e.lineno})") from None
        if not isinstance(doc, dict) or doc.get("tsproxy_key_ring") != FILE_VERSION:
            raise KeyRingError(f"{where}: not a tsproxy key ring of version {FILE_VERSION}")
        entries = doc.get("keys")
        if not isinstance(entries, list) or not entries:
            raise KeyRingError(f"{where}: 'keys' must be a non-empty list")
        keys = [_Kek.from_json(entry, f"{where}: key #{n}") for n, entry in enumerate(entries, 1)]
        seen: set[str] = set()
        for k in keys:
            if k.key_id in seen:
                raise KeyRingError(f"{where}: key id {k.key_id!r} appears twice")
            seen.add(k.key_id)
        active = doc.get("active")
        if not isinstance(active, str) or active not in seen:
            raise KeyRingError(f"{where}: 'active' must name one of the keys ({', '.join(sorted(seen))})")
        return cls(keys, active)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ring atomically (temporary file, fsync, rename) with mode 0600."""
        target = Path(path)
        doc = {
            "tsproxy_key_ring": FILE_VERSION,
            "active": self._active,
            "keys": [k.to_json() for k in self._keys.values()],
        }
        data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise KeyRingError(f"key ring {target}: cannot write: {e.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent, best_effort=True)

    @classmethod
    def new(cls, kind: str = AES_KW, key_id: str | None = None) -> KeyRing:
        """A ring holding one fresh key, active."""
        kek = _Kek.generate(kind, key_id if key_id is not None else _new_id())
        _check_id(kek.key_id)
        return cls([kek], kek.key_id)

    def add(self, kind: str = AES_KW, key_id: str | None = None) -> str:
        """Generate a new key (not active until activate()) and return its id."""
        key_id = key_id if key_id is not None else _new_id()
        _check_id(key_id)
        if key_id in self._keys:
            raise KeyRingError(f"key ring: key id {key_id!r} is already on the ring")
        self._keys[key_id] = _Kek.generate(kind, key_id)
        return key_id

    def activate(self, key_id: str) -> None:
        """Make key_id the KEK that wraps new DEKs."""
        if key_id not in self._keys:
            raise KeyRingError(f"key ring: no key {key_id!r} to activate")
        self._active = key_id

    def remove(self, key_id: str) -> None:
        """Drop a key; objects wrapped by it become unreadable, so the active key is refused."""
        if key_id not in self._keys:
            raise KeyRingError(f"key ring: no key {key_id!r} to remove")
        if key_id == self._active:
            raise KeyRingError(f"key ring: {key_id!r} is the active key; activate another one first")
        del self._keys[key_id]

    @property
    def active_id(self) -> str:
        """Id of the KEK that wraps new DEKs."""
        return self._active

    def ids(self) -> list[str]:
        """Ids of every key on the ring, in the order they were added."""
        return list(self._keys)

    def describe(self) -> list[dict[str, Any]]:
        """One entry per key: id, kind, created, active. Never key material."""
        return [
            {"id": k.key_id, "kind": k.kind, "created": k.created, "active": k.key_id == self._active}
            for k in self._keys.values()
        ]

    def wrap(self, dek: bytes) -> tuple[str, bytes]:
        """Wrap a DEK with the active KEK; returns (kek_id, wrapped)."""
        kek = self._keys[self._active]
        return kek.key_id, kek.wrap(dek)

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        """The DEK wrapped by kek_id: KeyNotFound if that KEK is not here, IntegrityError if it fails."""
        kek = self._keys.get(kek_id)
        if kek is None:
            raise KeyNotFound(f"KEK {kek_id!r} is not on the key ring")
        return kek.unwrap(wrapped)


def _new_id() -> str:
    return f"kek-{dt.datetime.now(dt.UTC):%Y%m%d}-{secrets.token_hex(3)}"
