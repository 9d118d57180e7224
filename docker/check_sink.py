"""The compose stack's final check, from outside it (run by docker/test.sh once the pipeline has
caught up):

    python docker/check_sink.py verify --sink DIR --producer-log FILE --workers NAME [NAME ...]

Every record the demo producer logged is in the sink exactly once (its Parquet files read with
pyarrow, per batch against the ledger's counts), every batch with records was read with
``--reader`` (the batches' manifests), and the executors per batch moved with the controller's
target: in the ledger, on the monitoring page (its API and its place in Airflow's UI) and in the
Spark worker containers (their work directories, through ``docker exec``). Nothing of the provider's
own code is used; the ledger, Airflow and the endpoints' options are check_stack.py's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
from collections import Counter

import check_stack as cs
from check_stack import CheckFailed

#: the demo producer's log line for each run of it
PRODUCED = re.compile(r"produced (\d+) records to (\S+) \(ids (\d+)\.\.(-?\d+)\)")


def produced_ids(path: str) -> list[int]:
    ids: list[int] = []
    for n, topic, first, last in PRODUCED.findall(open(path).read()):
        if topic == cs.TOPIC:
            if int(last) - int(first) + 1 != int(n):
                raise CheckFailed(f"producer report is inconsistent: {n} records, ids {first}..{last}")
            ids.extend(range(int(first), int(last) + 1))
    if not ids:
        raise CheckFailed(f"no 'produced N records' line in {path}: did the producer stop cleanly?")
    return ids


def read_sink(sink: str) -> tuple[list[int], list[tuple[int, int]], Counter]:
    """ids, (partition, offset) pairs and records per batch of every Parquet file in the sink."""
    import pyarrow.parquet as pq

    ids: list[int] = []
    positions: list[tuple[int, int]] = []
    per_batch: Counter = Counter()
    files = sorted(glob.glob(os.path.join(sink, "batch_id=*", "*.parquet")))
    if not files:
        raise CheckFailed(f"no Parquet file under {sink}/batch_id=*/")
    for f in files:
        t = pq.read_table(f, columns=["value", "partition", "offset"])
        batch_id = int(os.path.basename(os.path.dirname(f)).split("=", 1)[1])
        per_batch[batch_id] += t.num_rows
        ids.extend(json.loads(v)["id"] for v in t.column("value").to_pylist())
        positions.extend(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist()))
    return ids, positions, per_batch


def check_exactly_once(args: argparse.Namespace, rows: list[dict]) -> None:
    sent = produced_ids(args.producer_log)
    ids, positions, per_batch = read_sink(args.sink)
    dup_ids = [i for i, c in Counter(ids).items() if c > 1]
    dup_pos = [p for p, c in Counter(positions).items() if c > 1]
    missing = sorted(set(sent) - set(ids))
    extra = sorted(set(ids) - set(sent))
    if dup_ids or dup_pos or missing or extra or len(ids) != len(sent):
        raise CheckFailed(
            f"sink vs producer: {len(ids)} records read, {len(sent)} sent; duplicated ids {dup_ids[:10]}, "
            f"duplicated positions {dup_pos[:10]}, missing ids {missing[:10]} ({len(missing)}), "
            f"unexpected ids {extra[:10]} ({len(extra)})"
        )
    ledger = {b["batch_id"]: b["records"] or 0 for b in rows if b["status"] in cs.DONE}
    wrong = {b: (per_batch.get(b, 0), n) for b, n in ledger.items() if per_batch.get(b, 0) != n}
    if wrong:
        raise CheckFailed(f"records per batch, sink vs ledger: {wrong}")
    cs.log(
        f"exactly once: all {len(sent)} produced records are in the sink once, in {len(per_batch)} batch directories"
    )


def check_reader(args: argparse.Namespace) -> None:
    """Every batch with records was read by ``args.reader`` (the image carries Spark's Kafka
    connector, so the demo pipeline's ``reader: auto`` is Spark's ``format("kafka")``)."""
    readers: Counter = Counter()
    for path in glob.glob(os.path.join(args.sink, "batch_id=*", "_manifest.json")):
        with open(path) as f:
            manifest = json.load(f)
        if manifest.get("records"):
            readers[manifest.get("reader")] += 1
    if set(readers) != {args.reader}:
        raise CheckFailed(
            f"readers of the batches with records: {dict(readers)}; expected only {args.reader!r}"
        )
    cs.log(f"reader: all {sum(readers.values())} batches with records read with reader={args.reader}")


def check_scaling(args: argparse.Namespace, rows: list[dict]) -> None:
    import requests

    done = [b for b in rows if b["status"] in cs.DONE and b["records"]]
    counts = [b["executors"] for b in done]
    if len(set(counts)) < 2:
        raise CheckFailed(f"executors per batch never changed: {counts}")

    # the executor target Variable and the monitoring page's data (Airflow's REST API, with a token)
    s = cs.airflow_session(args)
    target = json.loads(
        cs.airflow_get(args, s, f"/api/v2/variables/kbp.{cs.PIPELINE}.executor_target").json()["value"]
    )
    if target.get("previous") is None or target["previous"] == target["executors"]:
        raise CheckFailed(f"the executor target never changed: {target}")
    page = {
        b["batch_id"]: b["executors"]
        for b in cs.airflow_get(args, s, f"/kafka-backpressure/pipelines/{cs.PIPELINE}/batches").json()[
            "batches"
        ]
    }
    differ = {
        b["batch_id"]: (b["executors"], page.get(b["batch_id"]))
        for b in done
        if page.get(b["batch_id"]) != b["executors"]
    }
    if differ:
        raise CheckFailed(f"monitoring page executors differ from the ledger (ledger, page): {differ}")
    html = cs.airflow_get(args, s, "/kafka-backpressure/").text
    if "plot-executors" not in html:
        raise CheckFailed("the monitoring page has no executors chart")
    cs.airflow_get(args, s, "/plugin/kafka-backpressure")  # the page's place in the Airflow UI
    cs.log(
        f"executor target {target['previous']} -> {target['executors']}; monitoring page executors per batch {[page[b['batch_id']] for b in done]}"
    )

    # the batches' executors on the worker containers: the master names each application's id
    master = requests.get(f"{args.spark_ui}/json/", timeout=30).json()
    app_ids = {a["name"]: a["id"] for a in master.get("completedapps", []) + master.get("activeapps", [])}
    placed: dict[str, list[str]] = {}
    for worker in args.workers:
        out = subprocess.run(
            ["docker", "exec", worker, "sh", "-c", "cd /opt/spark-work && ls -d app-*/* 2>/dev/null || true"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for path in out:
            placed.setdefault(path.split("/")[0], []).append(worker)
    for b in done:
        app = app_ids.get(f"kbp-{cs.PIPELINE}-batch-{b['batch_id']}")
        if app is None:
            raise CheckFailed(f"batch {b['batch_id']}: no Spark application on the master")
        on = placed.get(app, [])
        if len(on) != b["executors"]:
            raise CheckFailed(
                f"batch {b['batch_id']} ({app}): ledger says {b['executors']} executors, workers ran {len(on)}: {on}"
            )
        if b["executors"] > 1 and len(set(on)) < 2:
            raise CheckFailed(f"batch {b['batch_id']} ({app}): {b['executors']} executors all on {on[0]}")
        cs.log(f"batch {b['batch_id']} ({app}): {len(on)} executor(s) on {sorted(Counter(on).items())}")


def verify(args: argparse.Namespace) -> None:
    rows = cs.batches(args)
    cs.fail_on_failed(rows)
    check_exactly_once(args, rows)
    check_reader(args)
    check_scaling(args, rows)


def main(argv: list[str] | None = None) -> int:
    p, sub = cs.command_parser(__doc__)
    p.add_argument("--reader", default="native", help="the reader every batch with records must have used")
    v = sub.add_parser("verify")
    v.add_argument("--sink", required=True, help="the sink directory of the demo pipeline, as seen from here")
    v.add_argument("--producer-log", required=True, help="the demo producer's output")
    v.add_argument("--workers", nargs="+", required=True, help="the Spark worker containers")
    return cs.dispatch({"verify": verify}, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
