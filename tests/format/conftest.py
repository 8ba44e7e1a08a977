"""Fixtures for the format tests: key rings are slow to make (RSA), so each is made once."""

from __future__ import annotations

import pytest

from tsproxy.format import KeyRing


@pytest.fixture(scope="session")
def ring() -> KeyRing:
    """An AES key-wrap ring with one active key."""
    return KeyRing.new(key_id="test-aes")


@pytest.fixture(scope="session")
def rsa_ring() -> KeyRing:
    """An RSA-OAEP ring (3072-bit) with one active key."""
    return KeyRing.new("rsa-oaep-sha256", key_id="test-rsa")
