"""Where a timed run's CPU went, from Linux's ``/proc``: the whole machine, named processes, and a
JVM's threads by kind (Spark's executor task threads, the JIT compiler, the garbage collector, the
rest). ``bench/reader_throughput.py --cpu`` prints it after each timed run.

Figures are in cores: CPU seconds over the run's wall seconds (2.0 is both cores of a 2-core
machine all the time). A thread that waits for a core does not count, so a task thread at 0.45
cores on a busy machine spent most of its run waiting for one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
#: Thread-name patterns of a HotSpot JVM running Spark, in the order they are tried.
_THREAD_KINDS = (
    ("tasks", re.compile(r"^Executor task")),
    ("jit", re.compile(r"Compiler|^Sweeper")),
    ("gc", re.compile(r"^(GC Thread|G1 |GC |VM Thread)")),
)


def _busy_ticks(stat: str) -> int:
    """utime + stime of one ``/proc/<pid>[/task/<tid>]/stat`` line (fields after the command name)."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def thread_kind(name: str) -> str:
    """``tasks``, ``jit``, ``gc`` or ``other`` for a JVM thread's name (as ``/proc`` truncates it)."""
    for kind, pattern in _THREAD_KINDS:
        if pattern.search(name):
            return kind
    return "other"


def snapshot(processes: Mapping[str, int | None], threads_of: str | None = None) -> dict[str, int]:
    """CPU ticks so far: ``machine`` (all cores, busy), each named process (``None`` pids and gone
    processes are left out), and, for the process named ``threads_of``, ``<name>.<kind>`` per thread
    kind (:func:`thread_kind`). This process counts as ``python`` (its own threads: a consumer's
    librdkafka threads included)."""
    out: dict[str, int] = {}
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in cpu]
    out["machine"] = sum(ticks) - ticks[3] - ticks[4]  # minus idle and iowait
    times = os.times()
    out["python"] = round((times.user + times.system) * _TICKS)
    for name, pid in processes.items():
        if pid is None:
            continue
        try:
            out[name] = _busy_ticks(Path(f"/proc/{pid}/stat").read_text())
        except OSError:
            continue
        if name != threads_of:
            continue
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended
                continue
            kind = f"{name}.{thread_kind(stat[stat.index('(') + 1 : stat.rindex(')')])}"
            out[kind] = out.get(kind, 0) + _busy_ticks(stat)
    return out


def cores(before: Mapping[str, int], after: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Cores used between two snapshots ``seconds`` apart, per key of ``after``. Threads that ended
    between the snapshots are missing from ``after``: a JVM's thread kinds may not add up to it."""
    return {k: max(v - before.get(k, 0), 0) / _TICKS / seconds for k, v in after.items()}


def describe(used: Mapping[str, float]) -> str:
    """``machine 1.75 cores: spark 1.52 (tasks 0.81, jit 0.30, gc 0.20, other 0.21), broker 0.20,
    python 0.02, the rest 0.01`` (the rest: processes not named, such as Spark's Python workers)."""
    parts = []
    named = 0.0
    for name, value in used.items():
        if name == "machine" or "." in name:
            continue
        named += value
        kinds = [(k.split(".", 1)[1], v) for k, v in used.items() if k.startswith(f"{name}.")]
        detail = f" ({', '.join(f'{k} {v:.2f}' for k, v in kinds)})" if kinds else ""
        parts.append(f"{name} {value:.2f}{detail}")
    machine = used.get("machine", 0.0)
    parts.append(f"the rest {max(machine - named, 0.0):.2f}")
    return f"machine {machine:.2f} cores: " + ", ".join(parts)


def group_snapshot(groups: Sequence[tuple[str, str]]) -> dict[str, int]:
    """CPU ticks so far per group of processes: ``machine``, and each ``(name, pattern)`` of
    ``groups``: every process whose command line (as ``setproctitle`` leaves it), or its nearest
    ancestor's that matches any pattern, matches ``pattern`` (the first that matches, in order), with
    what its children that ended used (``cutime``/``cstime``: Linux adds a child's CPU to its parent
    when the parent reaps it). So short-lived processes count with the group that started them: an
    Airflow task's process with its executor's worker, a Spark job's Python workers with the JVM. A
    process that ended between two snapshots counts in its parent's figure of the second; one that
    no parent has reaped yet is missing from both."""
    compiled = [(name, re.compile(pattern)) for name, pattern in groups]
    procs: dict[int, tuple[int, str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        procs[int(entry.name)] = (int(fields[1]), cmd, ticks)

    def group_of(pid: int) -> str | None:
        seen = 0
        while pid in procs and seen < 64:
            parent, cmd, _ = procs[pid]
            for name, pattern in compiled:
                if pattern.search(cmd):
                    return name
            pid, seen = parent, seen + 1
        return None

    out = {"machine": snapshot({})["machine"]}
    for pid, (_, _, ticks) in procs.items():
        name = group_of(pid)
        if name is not None:
            out[name] = out.get(name, 0) + ticks
    return out
