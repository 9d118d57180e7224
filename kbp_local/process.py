"""What every local server of the demo and the tests shares: one process, the leader of its own
session (so a stop reaches its children: a JVM's Python workers), started with its output in a log,
waited for until it answers, stopped by its process group; a context manager.

A server says what it is (:attr:`LocalServer.what`, :attr:`LocalServer.address`), how it starts
(:meth:`LocalServer.command`, and optionally :meth:`LocalServer.prepare`, :meth:`LocalServer.env`,
:attr:`LocalServer.cwd`), when it is ready (:meth:`LocalServer.ready`) and what it leaves behind
(:meth:`LocalServer.cleanup`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from typing import Self

__all__ = ["LocalServer", "free_port", "free_ports", "port_open", "ports_beside", "stop_session"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` that nothing listens on now (see :func:`free_ports` for several)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1", *, besides: Iterable[int] = ()) -> list[int]:
    """``count`` distinct ports of ``host`` that nothing listens on now, none of ``besides``.

    Each socket stays bound until all are chosen: the kernel hands a port out again as soon as its
    socket is closed, and two :func:`free_port` calls in a row once returned the same port under
    load (a SeaweedFS server's master gRPC and filer ports, 2026-12-02: the filer could not bind)."""
    taken = set(besides)
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if port not in taken:
                taken.add(port)
                ports.append(port)
        return ports


def ports_beside(
    port: int | None, others: int, host: str = "127.0.0.1", *, besides: Iterable[int | None] = ()
) -> tuple[int, list[int]]:
    """A server's main ``port`` (a free one when None) and ``others`` more free ports for its other
    listeners: all distinct, none of them ``port`` or ``besides`` (ports given for it elsewhere)."""
    given = [p for p in (port, *besides) if p]
    chosen = free_ports(others + (0 if port else 1), host, besides=given)
    return (port or chosen.pop()), chosen


def stop_session(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Stop a server started as the leader of its own session: SIGCONT (a test may have frozen it),
    SIGTERM to its whole process group, SIGKILL if the leader has not exited within ``timeout_s``;
    then SIGKILL to whatever is left in the group (a JVM's Python workers)."""
    for sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGCONT:
            continue
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def port_open(host: str, port: int) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class LocalServer:
    #: what the server is, in messages ("Kafka", "SeaweedFS's S3 gateway", ...)
    what: ClassVar[str] = "the server"
    #: what a failure to start or a second start raises
    error: ClassVar[type[Exception]] = RuntimeError
    start_timeout_s: ClassVar[float] = 60.0
    stop_timeout_s: ClassVar[float] = 30.0
    #: how often the start-up wait asks :meth:`ready`
    ready_interval_s: ClassVar[float] = 0.2

    process: subprocess.Popen[bytes] | None = None

    # what a server says about itself

    @property
    def address(self) -> str:
        """Where clients reach it, in messages."""
        raise NotImplementedError

    @property
    def log_path(self) -> Path | None:
        """Where its output goes (None: nowhere)."""
        return None

    @property
    def cwd(self) -> Path | None:
        return None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """Before the process starts: its files and folders."""

    def env(self) -> dict[str, str] | None:
        """The process's environment (None: this process's)."""
        return None

    def ready(self) -> bool:
        """True once it answers its clients."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """After it stopped: what it leaves outside its folders."""

    # the life cycle, the same for every server

    def start(self, timeout_s: float | None = None) -> Self:
        if self.process is not None:
            raise self.error(f"{self.what} on {self.address} already started (pid {self.pid})")
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        self.prepare()
        command = self.command()
        log = self.log_path
        see = f"; see {log}" if log else ""
        out = open(log, "ab") if log else None  # noqa: SIM115 - closed once the child has it
        try:
            self.process = subprocess.Popen(
                command,
                stdout=out if out else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env=self.env(),
                start_new_session=True,
            )
        finally:
            if out:
                out.close()
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                self.process = None
                self.stop()  # what it left behind
                raise self.error(f"{self.what} exited with code {code} while starting on {self.address}{see}")
            if self.ready():
                return self
            if time.monotonic() >= deadline:
                self.stop()
                raise self.error(f"{self.what} on {self.address} did not answer within {timeout_s:g}s{see}")
            time.sleep(self.ready_interval_s)

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM to its process group, SIGKILL after ``timeout_s``, then :meth:`cleanup`."""
        proc, self.process = self.process, None
        if proc is not None:
            stop_session(proc, self.stop_timeout_s if timeout_s is None else timeout_s)
        self.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
