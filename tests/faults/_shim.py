"""A tiny HTTP shim in front of a real server that answers the first K requests itself.

Used for S3 ``503 SlowDown`` and GCS ``429 rateLimitExceeded`` bursts: neither SeaweedFS nor
fake-gcs-server can be told to throttle, so the shim (a threaded ``http.server`` on
127.0.0.1) answers ``status`` for the first ``burst`` requests, then forwards every later
request unchanged (same method, target, headers including ``Host``, body) to the real server
over a fresh ``http.client`` connection. SigV4 signatures stay valid because ``Host`` is
forwarded verbatim.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

S3_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
GCS_429 = (
    b'{"error": {"code": 429, "message": "The rate of change requests to the object is too '
    b'high.", "errors": [{"reason": "rateLimitExceeded"}]}}'
)
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection"}


class ThrottleShim:
    def __init__(self, upstream_port: int, *, status: int, body: bytes, content_type: str) -> None:
        self.upstream_port = upstream_port
        self.status = status
        self.body = body
        self.content_type = content_type
        self.burst = 0
        self.throttled = 0
        self.forwarded = 0
        self._lock = threading.Lock()
        shim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with shim._lock:
                    throttle = shim.burst > 0
                    if throttle:
                        shim.burst -= 1
                        shim.throttled += 1
                    else:
                        shim.forwarded += 1
                if throttle:
                    self.send_response(shim.status)
                    self.send_header("Content-Type", shim.content_type)
                    self.send_header("Content-Length", str(len(shim.body)))
                    self.end_headers()
                    self.wfile.write(shim.body)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", shim.upstream_port, timeout=10)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def throttle_next(self, k: int) -> None:
        with self._lock:
            self.burst = k

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
