"""Key ring file handling, DEK wrapping, object contexts and rewrap."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fmt_helpers import make_data

from tsproxy.errors import ConfigError, FormatError, IntegrityError, KeyNotFound, KeyRingError
from tsproxy.format import (
    MIN_CHUNK_SIZE,
    KeyRing,
    ObjectContext,
    TransformSettings,
    decode_object,
    encode_object,
    encode_tail,
    open_object,
    rewrap,
)
from tsproxy.format.keyring import InsecureKeyRing, check_private


def test_save_load_roundtrip_with_private_mode(tmp_path: Path, rsa_ring: KeyRing) -> None:
    ring = KeyRing.new(key_id="one")
    ring.add(key_id="two")
    path = tmp_path / "ring.json"
    ring.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = KeyRing.load(path)
    assert loaded.ids() == ["one", "two"] and loaded.active_id == "one"
    dek = os.urandom(32)
    kek_id, wrapped = ring.wrap(dek)
    assert kek_id == "one" and len(wrapped) == 40
    assert loaded.unwrap(kek_id, wrapped) == dek
    assert [p.name for p in tmp_path.iterdir()] == ["ring.json"]  # no temporary file left behind

    rsa_ring.save(tmp_path / "rsa.json")
    rsa_loaded = KeyRing.load(tmp_path / "rsa.json")
    kek_id, wrapped = rsa_loaded.wrap(dek)
    assert rsa_ring.unwrap(kek_id, wrapped) == dek


def test_save_replaces_an_existing_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    KeyRing.new(key_id="k").save(path)
    assert KeyRing.load(path).ids() == ["k"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_activate_and_remove(tmp_path: Path) -> None:
    ring = KeyRing.new(key_id="old")
    new = ring.add()
    assert new.startswith("kek-") and ring.active_id == "old"
    with pytest.raises(KeyRingError, match="active"):
        ring.remove("old")
    ring.activate(new)
    ring.remove("old")
    assert ring.ids() == [new]
    for bad in (lambda: ring.activate("nope"), lambda: ring.remove("nope"), lambda: ring.add(key_id=new)):
        with pytest.raises(KeyRingError):
            bad()
    with pytest.raises(KeyRingError, match="key id"):
        ring.add(key_id="has space")
    with pytest.raises(KeyRingError, match="kind"):
        ring.add("des")


def test_unwrap_errors(ring: KeyRing) -> None:
    kek_id, wrapped = ring.wrap(os.urandom(32))
    with pytest.raises(KeyNotFound):
        ring.unwrap("absent", wrapped)
    with pytest.raises(IntegrityError):
        ring.unwrap(kek_id, wrapped[:-1] + bytes([wrapped[-1] ^ 1]))
    with pytest.raises(IntegrityError):
        ring.unwrap(kek_id, wrapped[:20])


def test_rsa_unwrap_errors(rsa_ring: KeyRing) -> None:
    kek_id, wrapped = rsa_ring.wrap(os.urandom(32))
    with pytest.raises(IntegrityError):
        rsa_ring.unwrap(kek_id, bytes(len(wrapped)))
    with pytest.raises(IntegrityError):
        rsa_ring.unwrap(kek_id, wrapped[:40])


def test_describe_never_shows_key_material(tmp_path: Path, rsa_ring: KeyRing) -> None:
    ring = KeyRing.new(key_id="a")
    ring.save(tmp_path / "r.json")
    material = json.loads((tmp_path / "r.json").read_text())["keys"][0]["key"]
    described = ring.describe()
    assert described == [
        {"id": "a", "kind": "aes-256-kw", "created": described[0]["created"], "active": True}
    ]
    assert material not in json.dumps(described) + repr(ring)
    assert set(rsa_ring.describe()[0]) == {"id", "kind", "created", "active"}


def _write(path: Path, doc: object) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _entry(**overrides: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": "k1",
        "kind": "aes-256-kw",
        "created": "2026-01-01T00:00:00Z",
        "key": base64.b64encode(bytes(32)).decode(),
    }
    entry.update(overrides)
    return entry


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{not json", "not valid JSON"),
        ({"tsproxy_key_ring": 2, "active": "k1", "keys": [_entry()]}, "version 1"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": []}, "non-empty"),
        ({"tsproxy_key_ring": 1, "active": "k2", "keys": [_entry()]}, "'active' must name"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": [_entry(), _entry()]}, "twice"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": [_entry(key="***")]}, "base64"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": [_entry(key="AAAA")]}, "32 bytes"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": [_entry(kind="rot13")]}, "unknown kind"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": [_entry(id=5)]}, "'id' missing"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": ["k1"]}, "must be an object"),
        ({"tsproxy_key_ring": 1, "active": "k1", "keys": [_entry(kind="rsa-oaep-sha256")]}, "PKCS#8"),
    ],
)
def test_bad_files_are_named_clearly(tmp_path: Path, doc: object, message: str) -> None:
    with pytest.raises(KeyRingError, match=message) as info:
        KeyRing.load(_write(tmp_path / "ring.json", doc))
    assert str(tmp_path / "ring.json") in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KeyRingError, match="no such file"):
        KeyRing.load(tmp_path / "absent.json")


def test_small_rsa_keys_are_refused(tmp_path: Path) -> None:
    small = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = small.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    entry = _entry(kind="rsa-oaep-sha256", key=base64.b64encode(der).decode())
    with pytest.raises(KeyRingError, match="3072"):
        KeyRing.load(_write(tmp_path / "ring.json", {"tsproxy_key_ring": 1, "active": "k1", "keys": [entry]}))


def test_context_state_holds_no_plain_dek(ring: KeyRing) -> None:
    cfg = TransformSettings()
    ctx = ObjectContext.new(cfg, ring)
    assert ctx.dek is not None
    state = ctx.to_state()
    assert ctx.dek not in state
    assert ctx.dek.hex() not in repr(ctx)
    again = ObjectContext.from_state(state, ring)
    assert again == ctx
    with pytest.raises(KeyNotFound):
        ObjectContext.from_state(state, None)
    with pytest.raises(FormatError):
        ObjectContext.from_state(b"\x09" + state[1:], ring)
    with pytest.raises(IntegrityError):
        ObjectContext.from_state(state[:-3], ring)

    plain = ObjectContext.new(TransformSettings(encryption=False), None)
    assert plain.dek is None and ObjectContext.from_state(plain.to_state(), None) == plain
    with pytest.raises(ConfigError):
        ObjectContext.new(cfg, None)


def test_rewrap_moves_an_object_to_the_new_kek_without_touching_its_data() -> None:
    ring = KeyRing.new(key_id="old")
    cfg = TransformSettings(chunk_size=MIN_CHUNK_SIZE)
    original = make_data("text", 150_000, 1)
    stored = encode_object(original, cfg, ring, metadata={"a": "b"})
    manifest, ctx = open_object(stored, ring)

    ring.activate(ring.add(key_id="new"))
    new_manifest, new_ctx = rewrap(manifest, ctx, ring)
    assert new_manifest.kek_id == "new" and new_ctx.kek_id == "new" and new_ctx.dek == ctx.dek
    assert new_manifest.metadata == {"a": "b"} and new_manifest.segments == manifest.segments
    rewrapped = stored[: manifest.data_size] + encode_tail(new_manifest, new_ctx)
    ring.remove("old")
    assert decode_object(rewrapped, ring) == original
    with pytest.raises(KeyNotFound):
        decode_object(stored, ring)


def test_rewrap_leaves_unencrypted_objects_alone(ring: KeyRing) -> None:
    stored = encode_object(b"abc", TransformSettings(encryption=False), None)
    manifest, ctx = open_object(stored, None)
    assert rewrap(manifest, ctx, ring) == (manifest, ctx)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_size": 65535},
        {"chunk_size": 64 * 1024 * 1024 + 1},
        {"compression": "gzip"},
        {"level": 0},
        {"level": 23},
    ],
)
def test_settings_are_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        TransformSettings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "owner", "refused"),
    [
        (0o600, "root", False),
        (0o400, "other", False),
        (0o600, "other", False),
        (0o640, "root", False),  # a Secret volume with fsGroup: root's file, read by the pod's group
        (0o440, "root", False),
        (0o640, "other", True),  # PostgreSQL's rule: group read only for a file root owns
        (0o660, "root", True),
        (0o604, "root", True),
        (0o644, "other", True),
        (0o666, "root", True),
    ],
)
def test_check_private(tmp_path: Path, mode: int, owner: str, refused: bool) -> None:
    path = tmp_path / "ring.json"
    KeyRing.new().save(path)
    os.chmod(path, mode)
    if (owner == "root") != (os.getuid() == 0):
        if os.getuid() != 0:
            pytest.skip("needs root to give the file another owner")
        os.chown(path, 4242, -1)
    if refused:
        with pytest.raises(InsecureKeyRing) as e:
            check_private(path)
        assert str(e.value).startswith(f"key ring {path}: mode {mode:04o} ")
        assert isinstance(e.value, ConfigError)  # `tsproxy serve` turns it into exit code 2
    else:
        check_private(path)


def test_check_private_follows_links_and_leaves_a_missing_file_to_load(tmp_path: Path) -> None:
    target = tmp_path / "..data" / "ring.json"
    target.parent.mkdir()
    KeyRing.new().save(target)
    link = tmp_path / "ring.json"
    link.symlink_to(target)
    check_private(link)  # the link's own mode (0777) does not count
    os.chmod(target, 0o644)
    with pytest.raises(InsecureKeyRing):
        check_private(link)
    check_private(tmp_path / "absent.json")
