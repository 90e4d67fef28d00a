"""Whether a service keeps an idle client connection open as long as clients expect."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

# httpx keeps an idle connection for 5 s, the same as uvicorn's default keep-alive: a
# request sent on it as the server closes it fails (httpx.ReadError on a POST).
CLIENT_IDLE_S = 6.0


def answers_after_idle(url: str, path: str, idle_s: float = CLIENT_IDLE_S) -> bool:
    """Send a request on one connection, wait ``idle_s``, send another on the same
    connection: whether the server answered the second (it had not closed it)."""
    parts = urlsplit(url)
    request = f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n\r\n".encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        if not _status_line(sock).startswith(b"HTTP/1.1 "):
            raise AssertionError("the first request was not answered")
        time.sleep(idle_s)
        try:
            sock.sendall(request)
            return _status_line(sock).startswith(b"HTTP/1.1 ")
        except OSError:
            return False


def _status_line(sock: socket.socket) -> bytes:
    """The status line of the next response, read whole (by its Content-Length) so that
    the next read begins at the next response; empty where the server closed."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        received += chunk
    head, body = received.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        body += chunk
    return lines[0]
