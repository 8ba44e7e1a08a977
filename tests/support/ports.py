"""Free TCP ports on the loopback interface, for servers started by tests.

A port found free can be taken by someone else before the server binds it; callers that start a
server should retry with new ports when it fails to bind (tests/support/seaweed.py does).
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator

HOST = "127.0.0.1"


def _ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections (32768 if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def is_free(port: int, host: str = HOST) -> bool:
    """Whether `port` can be bound on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the kernel says is free (bind to port 0, read it back, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = HOST) -> list[int]:
    """`count` distinct free ports."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port(host))
    return sorted(ports)


def free_low_port(host: str = HOST) -> int:
    """A free port below the kernel's ephemeral range: one that no outgoing connection can take while
    its server is away (a link of toxiproxy that is cut and opened again listens on it again)."""
    return free_port_pair(0, host)[0]


def free_port_pair(offset: int = 10000, host: str = HOST, exclude: set[int] | None = None) -> tuple[int, int]:
    """A port P such that P and P + `offset` are both free: (P, P + offset).

    For servers that open a second port at a fixed offset (SeaweedFS puts gRPC at port + 10000).
    Both are picked below the kernel's ephemeral range, so outgoing connections of the test run
    cannot take them in the meantime.
    """
    exclude = exclude or set()
    high = _ephemeral_low() - offset - 1
    low = 10000
    if high <= low:
        raise RuntimeError(f"no room below the ephemeral port range for an offset of {offset}")
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(low, high)
        if port in exclude or port + offset in exclude:
            continue
        if is_free(port, host) and is_free(port + offset, host):
            return port, port + offset
    raise RuntimeError("no free port pair found")


def free_ports_with_offset(count: int, offset: int = 10000, host: str = HOST) -> list[int]:
    """`count` distinct ports P, each with P + `offset` free too (see `free_port_pair`)."""
    taken: set[int] = set()
    ports: list[int] = []
    while len(ports) < count:
        port, twin = free_port_pair(offset, host, exclude=taken)
        taken.update((port, twin))
        ports.append(port)
    return ports


def default_ports() -> list[tuple[str, int]]:
    """The addresses `tsproxy serve` listens on when not told otherwise (S3 API, metrics)."""
    from tsproxy import defaults

    return [defaults.LISTEN, defaults.METRICS_LISTEN]


@contextlib.contextmanager
def hold_default_ports() -> Iterator[list[tuple[str, int]]]:
    """Listen on tsproxy's default addresses while the block runs, as a `tsproxy serve` started with
    its defaults would; yields those taken here (one already in use is held by someone else anyway)."""
    held: list[tuple[str, int]] = []
    with contextlib.ExitStack() as stack:
        for host, port in default_ports():
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            try:
                s.bind((host, port))
            except OSError:
                continue
            s.listen()  # a listening socket: a SO_REUSEADDR bind (aiohttp's) fails on it too
            held.append((host, port))
        yield held
