"""An HTTP proxy in front of the tests' S3 server that makes two writers' PUTs of one object meet.

Every request is passed through unchanged (headers, signature and body as the client sent them: the
proxy only relays bytes), except a PUT whose path matches ``contested``: it is held until a second
PUT of the same path arrives, or ``release_if()`` returns True, or ``timeout_s`` has passed; then
each held PUT goes on to the server. Two Delta drivers that both passed their "is version N's log
entry absent?" check then both write it, as they would if their PUTs crossed on the network, instead
of only when they happen to fall within the same milliseconds.

``puts`` counts the PUTs of each contested path that reached the server.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


class PutBarrier:
    def __init__(
        self,
        upstream: str,
        contested: str,
        *,
        timeout_s: float = 180.0,
        release_if: Callable[[], bool] = lambda: False,
    ) -> None:
        target = urlsplit(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.contested = re.compile(contested)
        self.timeout_s = timeout_s
        self.release_if = release_if
        self.puts: Counter[str] = Counter()
        self.held: Counter[str] = Counter()
        self.released_by: list[str] = []
        self._cond = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> PutBarrier:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _wait_for_partner(self, path: str) -> None:
        """Hold this PUT of ``path`` until another one arrives (then both go), ``release_if()`` says
        no other can come, or the time is up."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self.held[path] += 1
            self._cond.notify_all()
            while self.held[path] < 2:
                if self.release_if():
                    self.released_by.append("release_if")
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    self.released_by.append("timeout")
                    return
                self._cond.wait(min(left, 0.5))
            self.released_by.append("partner")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        barrier = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for PUTs that expect it

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    raw = b""
                    while True:  # relayed as sent: the chunk framing included
                        line = self.rfile.readline()
                        raw += line
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while True:
                                trailer = self.rfile.readline()
                                raw += trailer
                                if trailer in (b"\r\n", b"\n", b""):
                                    return raw
                        raw += self.rfile.read(size + 2)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _relay(self) -> None:
                body = self._body()
                path = urlsplit(self.path).path
                contested = self.command == "PUT" and barrier.contested.search(path) is not None
                if contested:
                    barrier._wait_for_partner(path)
                conn = http.client.HTTPConnection(*barrier.upstream, timeout=120)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for key, value in self.headers.items():
                        conn.putheader(key, value)
                    conn.endheaders()
                    if body:
                        conn.send(body)
                    resp = conn.getresponse()
                    data = resp.read()
                    if contested and resp.status < 300:
                        with barrier._cond:
                            barrier.puts[path] += 1
                    self.send_response(resp.status, resp.reason)
                    for key, value in resp.getheaders():
                        if key.lower() not in _HOP_BY_HOP:
                            self.send_header(key, value)
                    if self.command == "HEAD":
                        self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
                        self.end_headers()
                    else:
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        return Handler
