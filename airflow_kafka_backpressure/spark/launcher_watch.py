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
SIGKILL after ``grace_s`` if it is still there; once it is gone, the caller's ``cleanup`` runs (the
job removes the attempt's hand-off directory and local scratch directory: nobody else will, and the
scratch directory may hold the private properties file of secret Spark settings), and this process
exits. In cluster mode the driver
runs elsewhere: the PID does not match and nothing is watched. Linux only (``/proc``); elsewhere
nothing is watched and only the engine's explicit stop applies.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from airflow_kafka_backpressure.batch.handoff import LAUNCHER_PID_ENV, SCRATCH_DIR_ENV
from airflow_kafka_backpressure.storage import Location

log = logging.getLogger(__name__)


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent PID)`` of ``pid`` from ``/proc`` (None if it is gone or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
    try:
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        return state, int(ppid)
    except (ValueError, IndexError):
        return None


def parent_of(pid: int) -> int | None:
    """The parent PID of ``pid`` (None if the process is gone or there is no /proc)."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def has_ended(pid: int) -> bool:
    """Gone, or a zombie (ended; its new parent has not reaped it yet)."""
    stat = _stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def launcher_pid(environ: dict[str, str] | None = None) -> int | None:
    raw = (os.environ if environ is None else environ).get(LAUNCHER_PID_ENV, "")
    try:
        pid = int(raw)
    except ValueError:
        return None
    return pid if pid > 1 else None


def _wait_ended(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not has_ended(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def remove_attempt_files(job_dir: Location, environ: dict[str, str] | None = None) -> None:
    """Delete the attempt's hand-off directory and the local scratch directory named in
    :data:`SCRATCH_DIR_ENV`. The scratch directory is removed only if it is named after the same
    attempt as the hand-off directory (both are), so a stray variable cannot point this at
    anything else."""
    import shutil
    from pathlib import Path

    job_dir.delete()
    scratch = (os.environ if environ is None else environ).get(SCRATCH_DIR_ENV, "")
    if not scratch:
        return
    path = Path(scratch)
    if path.is_absolute() and path.name == job_dir.name:
        shutil.rmtree(path, ignore_errors=True)
    else:
        log.warning("not removing %s: it is not this attempt's scratch directory (%s)", scratch, job_dir.name)


def stop_jvm(jvm: int, grace_s: float) -> bool:
    """SIGTERM ``jvm``, then SIGKILL it if it is still there after ``grace_s``; True once it has ended."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(jvm, sig)
        except ProcessLookupError:
            return True
        if _wait_ended(jvm, wait_s):
            return True
    return False


class LauncherWatch:
    """The driver's side of the watch: hand-offs to the launcher go through :meth:`hand_back`, and
    the driver ends with :meth:`settle`.

    Once the watch has found the launcher gone it owns the end of this process: the driver's main
    thread, failing because its JVM was stopped, must neither write a result for a launcher that is
    gone (it would re-create the hand-off directory the cleanup removes) nor exit before the cleanup
    has run (the interpreter would end the watch's daemon thread with it)."""

    def __init__(self, thread: threading.Thread | None = None) -> None:
        self.thread = thread
        self._lock = threading.Lock()
        self._orphaned = False

    @property
    def orphaned(self) -> bool:
        return self._orphaned

    def _set_orphaned(self) -> None:
        with self._lock:  # waits for a hand-off in progress: the cleanup comes after it
            self._orphaned = True

    def hand_back(self, write: Callable[[], None]) -> bool:
        """Run ``write`` (a result for the launcher) unless the launcher is gone; True if it ran."""
        with self._lock:
            if self._orphaned:
                return False
            write()
            return True

    def settle(self) -> None:
        """Wait for the watch to finish its work (it then exits the process) if it found the launcher gone."""
        if self._orphaned and self.thread is not None:
            self.thread.join()


def watch_launcher(
    cleanup: Callable[[], None] | None = None, interval_s: float = 1.0, grace_s: float = 15.0
) -> LauncherWatch:
    """Start the watch (see the module's doc); its ``thread`` is None when nothing is watched.

    ``cleanup`` runs once the JVM has ended (not if it could not be stopped)."""
    launcher = launcher_pid()
    if launcher is None:
        return LauncherWatch()
    jvm = os.getppid()
    if parent_of(jvm) != launcher:
        log.info(
            "not watching the launcher: pid %s is not the parent of this driver's JVM (pid %s)", launcher, jvm
        )
        return LauncherWatch()
    watch = LauncherWatch()

    def run() -> None:
        while True:
            time.sleep(interval_s)
            if parent_of(jvm) == launcher:
                continue
            watch._set_orphaned()
            log.error(
                "the Airflow task process that launched this batch (pid %s) is gone: stopping this Spark "
                "application (driver JVM pid %s)",
                launcher,
                jvm,
            )
            if stop_jvm(jvm, grace_s):
                if cleanup is not None:
                    try:
                        cleanup()
                    except Exception:  # noqa: BLE001 - exiting anyway; say what is left
                        log.exception("could not remove what the batch left behind")
            else:
                log.error(
                    "the driver JVM (pid %s) did not end after SIGKILL; leaving its files in place", jvm
                )
            os._exit(1)

    watch.thread = threading.Thread(target=run, name="kbp-launcher-watch", daemon=True)
    watch.thread.start()
    return watch
