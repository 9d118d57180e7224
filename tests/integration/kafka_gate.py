"""A broker whose fetches can be held: Apache Kafka behind a TCP relay that, while closed, keeps
every Kafka Fetch request (API key 1) from reaching the broker, and passes everything else
(Metadata, ListOffsets, Produce, offset commits).

It is a network fault, not a product hook: a batch reading through it waits in its Kafka client's
fetch, inside the Spark task that reads (and, with the arrow writer, writes) the range, as it would
behind a broker that stopped serving reads. The broker advertises the relay's address, so every
connection a client opens after bootstrap goes through the relay too.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import psutil

from kbp_local.apache_kafka import KafkaBroker
from kbp_local.process import free_port

FETCH = 1


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class FetchGate:
    """The relay on ``127.0.0.1:port`` in front of the broker's listener on ``upstream_port``."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        #: client-side ports of the connections whose Fetch is being held
        self.held_ports: set[int] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    # ----- control ---------------------------------------------------------------------------
    def close(self) -> None:
        """Hold every Fetch from now on, until :meth:`open`."""
        with self._lock:
            self.held_ports.clear()
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def wait_for_held_fetch(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.held_ports:
                    return True
            time.sleep(0.1)
        return False

    def held_pids(self) -> list[int]:
        """The processes whose Fetch is held: the owners of the held connections' client ends."""
        with self._lock:
            ports = set(self.held_ports)
        pids = set()
        for c in psutil.net_connections(kind="tcp"):
            if c.pid and c.laddr and c.raddr and c.laddr.port in ports and c.raddr.port == self.port:
                pids.add(c.pid)
        return sorted(pids)

    def stop(self) -> None:
        self._stopped.set()
        self._open.set()
        self._server.close()

    # ----- relay -----------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, addr = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.host, self.upstream_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._requests, args=(client, upstream, addr[1]), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, client_port: int) -> None:
        """Client -> broker, a request at a time (size-prefixed frames; the API key leads each)."""
        try:
            while True:
                size = _recv_exact(client, 4)
                body = _recv_exact(client, int.from_bytes(size, "big")) if size else None
                if body is None:
                    return
                if int.from_bytes(body[:2], "big") == FETCH and not self._open.is_set():
                    with self._lock:
                        self.held_ports.add(client_port)
                    while not self._open.wait(0.2):
                        pass
                    if self._stopped.is_set():
                        return
                upstream.sendall(size + body)
        except OSError:
            return
        finally:
            _close(client, upstream)

    @staticmethod
    def _responses(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    return
                client.sendall(data)
        except OSError:
            return
        finally:
            _close(client, upstream)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


class GatedBroker(KafkaBroker):
    """Apache Kafka listening on a private port and advertising its :class:`FetchGate`;
    ``bootstrap`` is the gate's address (what clients are given)."""

    def __init__(self, work_dir: str | Path) -> None:
        port = free_port("127.0.0.1")
        self.gate = FetchGate(port)
        super().__init__(work_dir, port=port, advertised_port=self.gate.port)

    def stop(self, timeout_s: float = 30.0) -> None:
        super().stop(timeout_s)
        self.gate.stop()
