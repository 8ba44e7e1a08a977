"""An https store behind a CONNECT proxy, for tests, in front of a real plain-HTTP server.

- `certificate_for(host, directory)`: a throwaway CA and a server certificate for `host`, signed by it.
- `TlsFront`: terminates TLS with that certificate and relays the plaintext to the real server, keeping
  what each client sent (so a test can say what reached the store inside the tunnel).
- `ConnectProxy`: answers CONNECT only, and only with the Proxy-Authorization it was given; a granted
  tunnel goes to the TlsFront whatever host it names (the test's store name resolves nowhere), a refused
  one gets 407. Keeps every CONNECT's request head.

Both listen on an ephemeral loopback port and run on threads of their own; use them as context managers.
"""

from __future__ import annotations

import datetime
import ipaddress
import select
import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HOST = "127.0.0.1"
_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True)
class Certificate:
    ca: Path  # the CA's certificate, for the client's `verify`
    cert: Path
    key: Path


def _valid_for_a_day(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    """A certificate for `key`'s public half, valid from five minutes ago for a day; extensions to add."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def certificate_for(host: str, directory: Path) -> Certificate:
    """A CA made for this call and a certificate for `host` (and 127.0.0.1) it signed, as PEM files."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tsproxy test CA")])
    ca = (
        _valid_for_a_day(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _valid_for_a_day(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]), ca_name, key)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(host), x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = Certificate(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def _pipe(a: socket.socket, b: socket.socket, seen_from_a: bytearray | None = None) -> None:
    """Relay both ways until either side closes. What `a` sends is appended to `seen_from_a`."""
    sockets = [a, b]
    try:
        while True:
            # An SSL socket may hold decrypted bytes select() does not see: drain it before waiting.
            ready = [s for s in sockets if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready, _, _ = select.select(sockets, [], [], 30)
                if not ready:
                    return
            for s in ready:
                data = s.recv(1 << 16)
                if not data:
                    return
                if s is a and seen_from_a is not None:
                    seen_from_a += data
                (b if s is a else a).sendall(data)
    except OSError:
        return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Threaded:
    server: _Server

    def _serve(self, handler: type[socketserver.BaseRequestHandler]) -> None:
        self.server = _Server((HOST, 0), handler)
        self.server.owner = self  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@dataclass
class TlsFront(_Threaded):
    """TLS in front of a plain server at `target` ("host:port"); `received` holds each connection's
    plaintext from the client."""

    target: str
    certificate: Certificate
    received: list[bytearray] = field(default_factory=list)

    def __post_init__(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certificate.cert, self.certificate.key)
        self._context = context
        self._serve(_TlsHandler)


class _TlsHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        front: TlsFront = self.server.owner  # type: ignore[attr-defined]
        try:
            tls = front._context.wrap_socket(self.request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        host, port = front.target.rsplit(":", 1)
        with tls, socket.create_connection((host, int(port)), timeout=30) as upstream:
            seen = bytearray()
            front.received.append(seen)
            _pipe(tls, upstream, seen)


@dataclass
class ConnectProxy(_Threaded):
    """A CONNECT-only proxy that wants `authorization` (a Proxy-Authorization value) and sends every
    tunnel it grants to `tunnel_to` ("host:port")."""

    tunnel_to: str
    authorization: str
    connects: list[dict[str, str]] = field(default_factory=list)  # each CONNECT: target and headers
    refused: int = 0

    def __post_init__(self) -> None:
        self._serve(_ConnectHandler)


class _ConnectHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        proxy: ConnectProxy = self.server.owner  # type: ignore[attr-defined]
        request_line = self.rfile.readline(8192).decode("latin-1").strip()
        headers: dict[str, str] = {}
        while True:
            line = self.rfile.readline(8192).decode("latin-1")
            if line in ("\r\n", "\n", ""):
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        method = request_line.partition(" ")[0]
        proxy.connects.append({"request": request_line, **headers})
        if method != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        if headers.get("proxy-authorization") != proxy.authorization:
            proxy.refused += 1
            self.wfile.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n'
            )
            return
        host, port = proxy.tunnel_to.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as upstream:
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            # rfile is buffered: bytes the client sent after its CONNECT head may sit there (a client
            # waits for the 200 before its TLS hello, so this is the hello, read whole or in part).
            early = self.rfile.peek()
            upstream.sendall(self.rfile.read(len(early)))
            _pipe(self.request, upstream)
