"""A short soak in CI: ``bench/soak.py`` for a few batches with random faults (a fixed seed), as a
subprocess with its own broker, PostgreSQL ledger and ``airflow standalone``. It fails unless every
produced record is in the sink exactly once, the group is committed to the end and no batch is
left unfinished (the script's exit status). The 200-batch run's figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_with_random_faults_loses_and_duplicates_nothing():
    # Inside the checkout (short paths for the sockets), in a folder of this run's own: the script
    # refuses a work directory that exists, and a failed run keeps its folder for its logs.
    (REPO / ".tmp").mkdir(exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix="soak-ci-", dir=REPO / ".tmp"))
    parent.chmod(0o755)  # as a plain mkdir would make it (the soak's servers may run as other users)
    work = parent / "work"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--batches",
            "5",
            "--fault-rate",
            "0.35",
            "--seed",
            "7",
            "--max-minutes",
            "12",
            "--recover-timeout-s",
            "600",
            "--work-dir",
            str(work),
        ],
        cwd=REPO,
        env={**_env(), "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=40 * 60)  # a backstop: the script bounds itself
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the script stops Airflow, the broker and PostgreSQL it started
        stdout, stderr = proc.communicate(timeout=300)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    text = done.stdout
    report = json.loads(text[text.index("{\n") : text.index("\n}") + 2])
    assert report["records_produced"] > 0 and report["records_written"] == report["records_produced"], report
    assert report["records_duplicated"] == report["records_missing"] == report["records_lost"] == 0, report
    assert not report["stuck_batches"] and not report["unrecovered_faults"], report
    shutil.rmtree(parent, ignore_errors=True)  # kept on failure: the logs of Airflow, its tasks, the broker
    print(
        f"short soak: {report['batches']} batches, faults {report['faults']}, {report['records_written']} records"
    )


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
