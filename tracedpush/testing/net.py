"""Network helpers for tests: a free local port."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it; racy only in theory)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
