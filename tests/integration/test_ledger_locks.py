"""Ledger-held locks on a real SQLite file and a real PostgreSQL: one holder at a time across
threads and processes, a bounded wait with a clear error, and a lock that dies with its holder."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.ledger.locks import ledger_lock
from airflow_kafka_backpressure.ledger.states import LedgerUnavailable

from .ledger_dbs import ledger, ledger_url  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from pathlib import Path
from airflow_kafka_backpressure.ledger import Ledger
from airflow_kafka_backpressure.ledger.locks import ledger_lock
url, name, flag = sys.argv[1:4]
with ledger_lock(Ledger(url), name, timeout_s=30):
    Path(flag).write_text("held")
    time.sleep(600)
"""


def test_read_modify_writes_under_the_lock_lose_no_update(ledger_url, tmp_path):  # noqa: F811
    """Threads, each with its own ledger object (own connections, own lock file handle), increment
    one counter with a read, a pause and a write: only mutual exclusion keeps every increment."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    name = f"p{secrets.token_hex(4)}:counter"
    threads, rounds = 4, 15
    errors: list[BaseException] = []

    def work() -> None:
        led = Ledger(ledger_url)
        try:
            for _ in range(rounds):
                with ledger_lock(led, name, timeout_s=60):
                    value = int(counter.read_text())
                    time.sleep(0.002)
                    counter.write_text(str(value + 1))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            led.dispose()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert int(counter.read_text()) == threads * rounds


def test_a_lock_held_by_another_process_bounds_the_wait_and_dies_with_its_holder(
    ledger, ledger_url, tmp_path
):  # noqa: F811
    name = f"p{secrets.token_hex(4)}:group-commit"
    flag = tmp_path / "held"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, ledger_url, name, str(flag)], cwd=REPO, start_new_session=True
    )
    try:
        for _ in range(600):
            if flag.exists() or holder.poll() is not None:
                break
            time.sleep(0.1)
        assert flag.exists(), f"the holder process did not take the lock (exit code {holder.poll()})"

        with pytest.raises(LedgerUnavailable) as e:
            with ledger_lock(ledger, name, timeout_s=0.5):
                pass
        message = str(e.value)
        assert f"Ledger lock {name!r}" in message and "still held by another task after 0.5 s" in message
        assert "retry this task" in message and ledger.url in message

        with ledger_lock(ledger, name + "-other", timeout_s=5):  # another name is free
            pass

        holder.send_signal(signal.SIGKILL)  # killed while holding: no unlock ever runs
        holder.wait(30)
        with ledger_lock(ledger, name, timeout_s=30):
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_a_waiter_renews_its_lease_while_it_waits_and_says_who_holds_the_lock(ledger):  # noqa: F811
    """A batch waiting for its table's lock renews its lease every so often (``while_waiting``), a
    renewal that fails ends the wait, and a timeout names the holder as the caller describes it."""
    name = f"p{secrets.token_hex(4)}:sink-commit"
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ledger_lock(ledger, name, timeout_s=30):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        renewals: list[float] = []
        with pytest.raises(LedgerUnavailable, match=r"still held after 1 s: the other batch's job goes on"):
            with ledger_lock(
                ledger,
                name,
                timeout_s=1,
                while_waiting=lambda: renewals.append(time.monotonic()),
                every_s=0.2,
                held_by="the other batch's job goes on",
            ):
                pass
        assert 3 <= len(renewals) <= 6, renewals

        class LeaseLost(Exception):
            pass

        def lost() -> None:
            raise LeaseLost("taken over")

        with pytest.raises(LeaseLost):
            with ledger_lock(ledger, name, timeout_s=30, while_waiting=lost, every_s=0.1):
                pass
    finally:
        release.set()
        holder.join(30)
