"""Checks of the compose stack's Celery executor, from outside it (run by docker/test.sh).

    python docker/check_workers.py wait-both --workers airflow-worker-1 airflow-worker-2 [--timeout 900]
    python docker/check_workers.py running-on --batch N --write-to FILE [--timeout 300]
    python docker/check_workers.py recovered --batch N --dead NAME --survivor NAME --since EPOCH [--timeout 900]

``wait-both``: batches of the demo pipeline with records, each run by its ingest task on one worker,
until every named worker has run at least one (the task instance's ``hostname`` is the worker's
name: ``KBP_HOSTNAME``, kbp_local/hostname.py). ``running-on``: the worker whose ingest task runs
batch N now (N from ``check_stack.py wait-in-spark``), written to FILE. ``recovered``: after that
worker's container was killed (SIGKILL) and removed at EPOCH, batch N finishes (the replay DAG
takes it once its ledger lease has expired), every ingest and replay task the pipeline ran since
EPOCH ran on the survivor, and the killed worker's ingest task ended failed (the scheduler's heartbeat timeout)
without a batch being written twice (that is the final ``check_sink.py verify``). Redis's
password: docker/check_secrets.py.

A batch is matched to its ingest task by the ledger's ``run_id`` (the DAG run that planned it). The
ledger is read with plain SQL and Airflow through its REST API, as check_stack.py does (whose
helpers and endpoints' options this reuses).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime

import check_stack as cs
from check_stack import CheckFailed, log

INGEST_DAG = f"kbp_ingest_{cs.PIPELINE}"
REPLAY_DAG = f"kbp_replay_{cs.PIPELINE}"
# task instance states on the way to an end (Airflow's State.unfinished, without importing Airflow)
UNFINISHED = (
    "scheduled",
    "queued",
    "running",
    "up_for_retry",
    "up_for_reschedule",
    "deferred",
    "restarting",
    None,
)


def ledger_runs(args: argparse.Namespace) -> dict[int, dict]:
    """The pipeline's batches by id, with the run that planned each."""
    import psycopg2

    conn = psycopg2.connect(args.postgres, connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT batch_id, run_id, status, records FROM kbp_batches WHERE pipeline = %s",
                (cs.PIPELINE,),
            )
            return {b: {"run_id": r, "status": s, "records": n} for b, r, s, n in cur.fetchall()}
    finally:
        conn.close()


def task_instances(args: argparse.Namespace, session, dag_id: str, task_id: str) -> list[dict]:
    """The task instances of ``dag_id``.``task_id`` over its runs, each run's latest try (up to 100
    runs: a test's stack runs fewer)."""
    body = cs.airflow_get(
        args, session, f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances?task_id={task_id}&limit=100"
    ).json()
    return body["task_instances"]


def _since(ti: dict, epoch: float) -> bool:
    started = ti.get("start_date")
    return bool(started) and datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp() >= epoch


def wait_both(args: argparse.Namespace) -> None:
    """Batches with records ran on every named worker."""
    s = cs.airflow_session(args)
    deadline = time.monotonic() + args.timeout
    last = None
    while True:
        by_run = {
            ti["dag_run_id"]: ti["hostname"]
            for ti in task_instances(args, s, INGEST_DAG, "ingest")
            if ti["state"] == "success"
        }
        on: dict[str, list[int]] = {w: [] for w in args.workers}
        for batch_id, b in sorted(ledger_runs(args).items()):
            host = by_run.get(b["run_id"])
            if b["status"] in cs.DONE and b["records"] and host is not None:
                on.setdefault(host, []).append(batch_id)
        summary = ", ".join(f"{w}: batches {ids or 'none'}" for w, ids in sorted(on.items()))
        if summary != last:
            last = summary
            log(f"ingest tasks by worker: {summary}")
        unknown = sorted(set(on) - set(args.workers))
        if unknown:
            raise CheckFailed(f"ingest tasks ran on {unknown}, none of the workers {args.workers}")
        if all(on[w] for w in args.workers):
            log(f"batches of pipeline {cs.PIPELINE} ran on each of {len(args.workers)} workers")
            return
        if time.monotonic() > deadline:
            raise CheckFailed(f"after {args.timeout:.0f} s not every worker has run a batch: {summary}")
        time.sleep(5)


def running_on(args: argparse.Namespace) -> None:
    """The worker whose ingest task runs batch --batch now."""
    s = cs.airflow_session(args)
    run_id = ledger_runs(args)[args.batch]["run_id"]
    deadline = time.monotonic() + args.timeout
    while True:
        tis = [ti for ti in task_instances(args, s, INGEST_DAG, "ingest") if ti["dag_run_id"] == run_id]
        running = [ti for ti in tis if ti["state"] == "running" and ti["hostname"]]
        if running:
            host = running[0]["hostname"]
            log(f"batch {args.batch} (run {run_id}) is running on {host}")
            with open(args.write_to, "w") as f:
                f.write(host)
            return
        if time.monotonic() > deadline:
            states = [(ti["state"], ti["hostname"]) for ti in tis]
            raise CheckFailed(f"batch {args.batch}'s ingest task (run {run_id}) is not running: {states}")
        time.sleep(1)


def recovered(args: argparse.Namespace) -> None:
    """Batch --batch finished after --dead was killed at --since; the pipeline's ingest and replay
    tasks since then ran on --survivor; the killed ingest task ended failed."""
    cs.wait_finished(args)
    s = cs.airflow_session(args)
    run_id = ledger_runs(args)[args.batch]["run_id"]
    deadline = time.monotonic() + args.timeout
    while True:
        killed = [ti for ti in task_instances(args, s, INGEST_DAG, "ingest") if ti["dag_run_id"] == run_id]
        if killed and killed[0]["state"] not in UNFINISHED:
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"batch {args.batch}'s killed ingest task did not end: {killed}")
        time.sleep(5)
    ti = killed[0]
    if ti["hostname"] != args.dead or ti["state"] != "failed":
        raise CheckFailed(
            f"batch {args.batch}'s ingest task (run {run_id}) ended {ti['state']} on {ti['hostname']}; "
            f"expected failed on the killed {args.dead}"
        )
    log(f"the killed worker's ingest task of batch {args.batch} ended failed (no heartbeat from {args.dead})")
    # the replay task marks the batch replayed in the ledger before Airflow marks the task a success:
    # until a replay task started since the kill has succeeded, one still running is waited for
    # (the rehearsal of 2026-12-01 21:57 read the task instances in between and failed)
    while True:
        since = [
            (dag, ti)
            for dag, task in ((INGEST_DAG, "ingest"), (REPLAY_DAG, "replay"))
            for ti in task_instances(args, s, dag, task)
            if _since(ti, args.since)
        ]
        later = [(dag, ti) for dag, ti in since if ti["state"] == "success"]
        replays = [ti for dag, ti in later if dag == REPLAY_DAG]
        pending = [ti for dag, ti in since if dag == REPLAY_DAG and ti["state"] in UNFINISHED]
        if replays or not pending:
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"the replay task(s) since the kill did not end: {pending}")
        time.sleep(2)
    if not replays:
        raise CheckFailed(
            f"no replay task succeeded after {args.dead} was killed, yet batch {args.batch} finished"
        )
    elsewhere = sorted({ti["hostname"] for _, ti in later} - {args.survivor})
    if elsewhere:
        raise CheckFailed(
            f"tasks ran on {elsewhere} after {args.dead} was killed; only {args.survivor} is left"
        )
    log(
        f"batch {args.batch} recovered on {args.survivor}: {len(replays)} replay and "
        f"{len(later) - len(replays)} ingest task(s) since the kill, all there"
    )


def main(argv: list[str] | None = None) -> int:
    p, sub = cs.command_parser(__doc__)
    w = sub.add_parser("wait-both")
    w.add_argument("--workers", nargs="+", required=True, help="the workers' names (their KBP_HOSTNAME)")
    w.add_argument("--timeout", type=float, default=900)
    r = sub.add_parser("running-on")
    r.add_argument("--batch", type=int, required=True)
    r.add_argument("--write-to", required=True, help="file to write the worker's name to")
    r.add_argument("--timeout", type=float, default=300)
    v = sub.add_parser("recovered")
    v.add_argument("--batch", type=int, required=True)
    v.add_argument("--dead", required=True, help="the killed worker")
    v.add_argument("--survivor", required=True, help="the worker left")
    v.add_argument("--since", type=float, required=True, help="when it was killed (seconds since the epoch)")
    v.add_argument("--timeout", type=float, default=900)
    commands = {
        "wait-both": wait_both,
        "running-on": running_on,
        "recovered": recovered,
    }
    return cs.dispatch(commands, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
