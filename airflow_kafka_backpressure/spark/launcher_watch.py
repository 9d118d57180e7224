"""The driver ends its Spark application when the Airflow task process that launched it is gone.

Runs inside the driver program of the submit engine in client deploy mode (the Python driver is a
child of the ``spark-submit`` JVM, which is a child of the Airflow task process). A task process
that is killed outright (SIGKILL, the OOM killer) cannot stop what it started; without this, the
JVM would run the batch on unattended — nobody collects its result, and its executors hold
resources — and would be re-parented to init.

Why not ``prctl(PR_SET_PDEATHSIG)`` in the child: that needs ``preexec_fn``, which makes
``subprocess`` fork the whole (multi-threaded) task process and run Python code between fork and
exec; Python documents that this can deadlock. It also runs every ``pthread_atfork`` handler: in a
process that has used a Spark Connect client (the connect engine; gRPC), each such launch runs
gRPC's fork handlers (measured here: every launch logs gRPC's ``fork_posix.cc``; without
``preexec_fn`` none does), and ``subprocess.Popen`` hanging there is a known gRPC bug
(grpc/grpc#37259, #17986). A launch that hangs before ``spark-submit`` runs cannot be stopped by
looking for its process. Watching from the driver keeps the launch a plain ``vfork``/``exec``.

How: the engine passes the task process's PID in :data:`LAUNCHER_PID_ENV`. If that PID is the parent
of this process's parent (the JVM), a daemon thread checks every ``interval_s`` that it still is;
once it is not (the task process died and the JVM was re-parented), the JVM gets SIGTERM (its
shutdown hooks stop the SparkContext, its Python workers and remove its temporary directories),
SIGKILL after ``grace_s`` if it is still there, and this process exits. In cluster mode the driver
runs elsewhere: the PID does not match and nothing is watched. Linux only (``/proc``); elsewhere
nothing is watched and only the engine's explicit stop applies.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from airflow_kafka_backpressure.handoff import LAUNCHER_PID_ENV

log = logging.getLogger(__name__)


def parent_of(pid: int) -> int | None:
    """The parent PID of ``pid`` from ``/proc`` (None if the process is gone or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (ValueError, IndexError):
        return None


def launcher_pid(environ: dict[str, str] | None = None) -> int | None:
    raw = (os.environ if environ is None else environ).get(LAUNCHER_PID_ENV, "")
    try:
        pid = int(raw)
    except ValueError:
        return None
    return pid if pid > 1 else None


def stop_jvm(jvm: int, grace_s: float) -> None:
    """SIGTERM ``jvm``, then SIGKILL it if it is still there after ``grace_s``."""
    try:
        os.kill(jvm, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if parent_of(jvm) is None:  # gone
            return
        time.sleep(0.2)
    try:
        os.kill(jvm, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch_launcher(interval_s: float = 1.0, grace_s: float = 15.0) -> threading.Thread | None:
    """Start the watch (see the module's doc); returns its thread, or None when nothing is watched."""
    launcher = launcher_pid()
    if launcher is None:
        return None
    jvm = os.getppid()
    if parent_of(jvm) != launcher:
        log.info("not watching the launcher: pid %s is not the parent of this driver's JVM (pid %s)", launcher, jvm)
        return None

    def run() -> None:
        while True:
            time.sleep(interval_s)
            if parent_of(jvm) == launcher:
                continue
            log.error(
                "the Airflow task process that launched this batch (pid %s) is gone: stopping this Spark "
                "application (driver JVM pid %s)", launcher, jvm,
            )
            stop_jvm(jvm, grace_s)
            os._exit(1)

    thread = threading.Thread(target=run, name="kbp-launcher-watch", daemon=True)
    thread.start()
    return thread
