"""Named locks held through the ledger's database, for read-modify-write sequences that span the
ledger and another system (the consumer group's commit, the controller's Airflow Variable).

Every task of a pipeline already shares its ledger, so the ledger is where they meet:

* **PostgreSQL** — a session-level advisory lock (``pg_try_advisory_lock``) on a connection taken
  for the lock alone, in autocommit (no transaction stays open, so ``idle_in_transaction_session_timeout``
  cannot end it). The server drops it when the holder's connection ends: a killed task never
  leaves it behind.
* **SQLite file** — an exclusive ``flock`` on a file beside the database (the SQLite ledger is
  per host); the kernel drops it when the holder's process ends.
* **SQLite in memory** (tests) — a lock of this process.

Waiting is bounded: :class:`~.states.LedgerUnavailable` names the lock, the ledger and the fix
after ``timeout_s``; a waiter may do something every so often while it waits (renew its batch's
lease). No schema change: nothing is written.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .states import LedgerError, LedgerUnavailable

__all__ = ["ledger_lock"]

_POLL_S = 0.05
_LOCAL: dict[tuple[int, str], threading.Lock] = {}
_LOCAL_GUARD = threading.Lock()


def _key(name: str) -> int:
    """A signed 64-bit advisory-lock key for ``name`` (stable across processes and hosts)."""
    return int.from_bytes(hashlib.sha256(f"kbp-lock:{name}".encode()).digest()[:8], "big", signed=True)


def _held_too_long(ledger: Any, name: str, timeout_s: float, held_by: str | None = None) -> LedgerUnavailable:
    if held_by is not None:
        return LedgerUnavailable(
            f"Ledger lock {name!r} at {ledger.url} is still held after {timeout_s:g} s: {held_by}"
        )
    return LedgerUnavailable(
        f"Ledger lock {name!r} at {ledger.url} is still held by another task after {timeout_s:g} s. Another "
        "task of the pipeline (record or replay, or a concurrent run) is in the same step and slow or stuck — "
        "its broker or Airflow calls are bounded, so it ends soon; retry this task. If it keeps happening, "
        "look for a hung task of this pipeline, or raise the ledger connection's extra timeout_s."
    )


@contextmanager
def ledger_lock(
    ledger: Any,
    name: str,
    timeout_s: float | None = None,
    *,
    while_waiting: Callable[[], Any] | None = None,
    every_s: float = 30.0,
    held_by: str | None = None,
) -> Iterator[None]:
    """Hold the ledger-wide lock ``name`` for the ``with`` block (waiting at most ``timeout_s``,
    default the ledger's bound). Not re-entrant. ``while_waiting`` is called every ``every_s``
    seconds of waiting (a lease's renewal; what it raises ends the wait); ``held_by``: who holds the
    lock and what to do, for the message when the wait times out."""
    timeout = float(ledger.timeout_s if timeout_s is None else timeout_s)
    wait = _Wait(ledger, name, timeout, while_waiting, every_s, held_by)
    engine = ledger.engine
    dialect = engine.dialect.name
    if dialect == "postgresql":
        with _postgres_lock(ledger, name, wait):
            yield
    elif dialect == "sqlite":
        database = engine.url.database
        if database in (None, "", ":memory:"):
            with _local_lock(ledger, name, wait):
                yield
        else:
            with _file_lock(Path(database).expanduser(), name, wait):
                yield
    else:
        raise LedgerError(
            f"The ledger at {ledger.url} is on {dialect}: its locks need PostgreSQL or SQLite. Point the "
            "pipeline's ledger_conn_id at a PostgreSQL database."
        )


class _Wait:
    """How a lock is waited for: until ``timeout`` (then :func:`_held_too_long`), calling
    ``while_waiting`` every ``every_s`` seconds meanwhile."""

    def __init__(
        self,
        ledger: Any,
        name: str,
        timeout: float,
        while_waiting: Callable[[], Any] | None,
        every_s: float,
        held_by: str | None,
    ) -> None:
        self.ledger, self.name, self.timeout, self.held_by = ledger, name, timeout, held_by
        self.while_waiting, self.every_s = while_waiting, max(float(every_s), _POLL_S)
        self.deadline = time.monotonic() + timeout
        self.next_call = time.monotonic() + self.every_s

    def until(self, try_once: Callable[[float], bool]) -> None:
        """Call ``try_once(seconds it may block)`` until it returns True; raise when the time is up."""
        while not try_once(max(0.0, min(self.deadline - time.monotonic(), self.every_s))):
            now = time.monotonic()
            if now >= self.deadline:
                raise _held_too_long(self.ledger, self.name, self.timeout, self.held_by)
            if self.while_waiting is not None and now >= self.next_call:
                self.while_waiting()
                self.next_call = now + self.every_s


def _polled(try_once: Callable[[], bool]) -> Callable[[float], bool]:
    """``try_once`` (which does not block) as a wait step: tried, then a short sleep if it failed."""

    def step(_: float) -> bool:
        if try_once():
            return True
        time.sleep(_POLL_S)
        return False

    return step


@contextmanager
def _postgres_lock(ledger: Any, name: str, wait: _Wait) -> Iterator[None]:
    key = _key(name)
    conn = ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        wait.until(
            _polled(lambda: bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()))
        )
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
    finally:
        conn.close()  # a lock left by a failed unlock ends with the session


@contextmanager
def _file_lock(database: Path, name: str, wait: _Wait) -> Iterator[None]:
    import fcntl

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    path = database.with_name(f"{database.name}.lock-{safe}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open(path, "a+b")  # noqa: SIM115 - held for the lock's lifetime
    try:

        def try_once() -> bool:
            try:
                fcntl.flock(fd.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

        wait.until(_polled(try_once))
        try:
            yield
        finally:
            fcntl.flock(fd.fileno(), fcntl.LOCK_UN)
    finally:
        fd.close()


@contextmanager
def _local_lock(ledger: Any, name: str, wait: _Wait) -> Iterator[None]:
    with _LOCAL_GUARD:
        lock = _LOCAL.setdefault((id(ledger.engine), name), threading.Lock())
    wait.until(lambda seconds: lock.acquire(timeout=seconds))
    try:
        yield
    finally:
        lock.release()
