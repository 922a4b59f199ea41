"""Free TCP ports on 127.0.0.1 for test servers.

A port is found by binding to port 0 and closing the socket, so another
process can in principle take it before our server binds it; callers that
start servers retry on "address already in use". Ports handed out by this
process are remembered so that two servers started here never get the same one.
"""

from __future__ import annotations

import socket
import threading

LOOPBACK = "127.0.0.1"

_lock = threading.Lock()
_handed_out: set[int] = set()


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port(*, also_free_at: int = 0) -> int:
    """Return a port of 127.0.0.1 that is free now.

    With ``also_free_at=k``, ``port + k`` is free too: SeaweedFS derives each
    gRPC port as its HTTP port + 10000 and some components dial that address
    regardless of explicit gRPC port flags.
    """
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port: int = sock.getsockname()[1]
        with _lock:
            if port in _handed_out:
                continue
            if also_free_at:
                other = port + also_free_at
                if other > 65535 or other in _handed_out or not _is_free(other):
                    continue
                _handed_out.add(other)
            _handed_out.add(port)
            return port
    raise RuntimeError("could not find a free port on 127.0.0.1")
