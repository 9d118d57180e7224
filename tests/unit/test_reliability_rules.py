"""Pure rules of issue 9 items 1–3: the replay's retention decision, sink fencing and adoption, the
atomic directory exchange, and the multi-host refusal of a SQLite ledger."""

from __future__ import annotations

import shlex

import pytest

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange, TopicPartition
from airflow_kafka_backpressure.ledger.replay_decision import retention_decision, trimmed_plan

T = "events"


def plan(*ranges: OffsetRange) -> BatchPlan:
    return BatchPlan("pipe", 7, "run-7", tuple(ranges), "/sink", 60_000, 0)


def r(p: int, a: int, b: int) -> OffsetRange:
    return OffsetRange(T, p, a, b)


def tp(p: int) -> TopicPartition:
    return TopicPartition(T, p)


def test_no_loss_replays_the_plan_as_it_is():
    pl = plan(r(0, 10, 20), r(1, 5, 5))
    d = retention_decision(pl, {tp(0): 10, tp(1): 9}, "fail")  # an empty range below earliest: no harm
    assert d.lost == () and d.refusal is None and d.ranges == pl.ranges
    assert trimmed_plan(pl, d) is pl


def test_skip_records_the_deleted_offsets_and_reads_the_rest():
    pl = plan(r(0, 10, 20), r(1, 10, 20), r(2, 10, 20))
    d = retention_decision(pl, {tp(0): 14, tp(1): 25, tp(2): 3}, "skip")
    assert d.lost == (DataLoss(T, 0, 10, 14), DataLoss(T, 1, 10, 20))
    assert d.lost_records == 14 and d.refusal is None
    assert d.ranges == (r(0, 14, 20), r(1, 20, 20), r(2, 10, 20)) and d.records == 16
    t = trimmed_plan(pl, d)
    assert (t.batch_id, t.output_path, t.ranges, t.data_loss) == (7, "/sink/batch_id=7", d.ranges, d.lost)


def test_fail_names_the_batch_the_offsets_and_the_abandon_command():
    d = retention_decision(plan(r(0, 10, 20)), {tp(0): 12}, "fail", ledger_conn_id="my ledger")
    assert d.lost == (DataLoss(T, 0, 10, 12),)
    assert "Batch 7 of pipeline 'pipe' cannot be replayed" in d.refusal
    assert "events-0[10, 12) (2 records)" in d.refusal and "earliest offsets now events-0: 12" in d.refusal
    command = d.refusal.split("run: ", 1)[1].split(" (or set", 1)[0]
    argv = shlex.split(command)
    assert argv[:7] == [
        "python",
        "-m",
        "airflow_kafka_backpressure.ledger",
        "abandon",
        "--conn-id",
        "my ledger",
        "--batch",
    ]
    assert argv[7] == "7" and argv[8] == "--reason"


def test_unknown_partitions_and_bad_modes():
    pl = plan(r(0, 10, 20))
    assert retention_decision(pl, {}, "skip").ranges == pl.ranges  # the job reports a missing partition
    with pytest.raises(ValueError, match="on_data_loss"):
        retention_decision(pl, {}, "ignore")


# --------------------------------------------------------------------------- fencing and adoption


def test_an_older_attempt_may_not_commit_over_a_newer_one():
    from airflow_kafka_backpressure.sinks.parquet.fencing import fence_problem

    assert fence_problem(3, 2, "a" * 32, None, None) is None
    assert fence_problem(3, 2, "a" * 32, 2, {"attempt": 2}) is None
    assert fence_problem(3, 2, "a" * 32, 1, {"attempt": 1}) is None  # newer than what exists
    assert "attempt 3 started writing it" in fence_problem(3, 2, "a" * 32, 3, None)
    msg = fence_problem(3, 2, "a" * 32, 2, {"attempt": 4, "token": "b" * 32})
    assert "batch 3: attempt 2" in msg and "attempt 4 (token bbbbbbbb…) committed it" in msg
    assert fence_problem(3, None, "a" * 32, 9, {"attempt": 9}) is None  # unfenced writes (direct calls)


def test_adoption_needs_a_complete_version_of_the_same_ranges_whichever_attempt_wrote_it():
    """Issue 21, item 3: a version committed by an attempt that is not the batch's last owner (a
    later replay claimed it and died before its own adoption check) is still adopted."""
    from airflow_kafka_backpressure.sinks.parquet.fencing import adoption_problems

    ranges = [r(0, 0, 10), r(1, 0, 10)]
    trimmed = [r(0, 4, 10), r(1, 0, 10)]  # what a replay writes after retention took offsets 0-3
    good = {
        "pipeline": "pipe",
        "token": "t1",
        "ranges": [x.to_dict() for x in reversed(ranges)],
        "files": [{"name": "f", "bytes": 1}],
    }
    assert adoption_problems(good, "pipe", ranges) == []
    assert adoption_problems({**good, "token": "t0"}, "pipe", ranges) == []  # not the last owner's: adopted
    assert adoption_problems(None, "pipe", ranges) == ["no committed version"]
    assert adoption_problems({**good, "pipeline": "x"}, "pipe", ranges) == ["written for pipeline 'x'"]
    assert "differ from the plan" in adoption_problems(good, "pipe", ranges[:1])[0]
    assert adoption_problems({**good, "files": []}, "pipe", ranges) == ["lists no files"]
    # a replay's own trimmed write (it died before marking) is adoptable by the next replay
    written = {**good, "ranges": [x.to_dict() for x in trimmed]}
    assert "differ from the plan" in adoption_problems(written, "pipe", ranges)[0]
    assert adoption_problems(written, "pipe", ranges, trimmed) == []


def test_fence_file_and_file_checks_on_a_local_sink(tmp_path):
    from airflow_kafka_backpressure.sinks.parquet.fencing import file_problems, raise_fence, read_fence
    from airflow_kafka_backpressure.storage import location

    root = location(str(tmp_path / "sink"))
    assert read_fence(root, 4) is None
    assert raise_fence(root, 4, 2, "a" * 32) is None and read_fence(root, 4) == 2
    assert raise_fence(root, 4, 3, "b" * 32) is None and read_fence(root, 4) == 3
    assert "attempt 3 started writing it" in raise_fence(root, 4, 2, "a" * 32)
    assert read_fence(root, 4) == 3
    d = tmp_path / "sink" / "batch_id=4"
    d.mkdir()
    (d / "a.parquet").write_bytes(b"12345")
    manifest = {"files": [{"name": "a.parquet", "bytes": 5}, {"name": "b.parquet", "bytes": 1}]}
    assert file_problems(location(str(d)), manifest) == ["b.parquet is missing"]
    manifest["files"][0]["bytes"] = 6
    assert file_problems(location(str(d)), manifest)[0] == "a.parquet has 5 bytes, the manifest says 6"
    # a decoded batch's error table is part of it: an adoption needs its files too
    ok = {"files": [{"name": "a.parquet", "bytes": 5}], "error_files": [{"name": "e.parquet", "bytes": 3}]}
    assert file_problems(location(str(d)), ok) == ["_errors/e.parquet is missing"]
    (d / "_errors").mkdir()
    (d / "_errors" / "e.parquet").write_bytes(b"123")
    assert file_problems(location(str(d)), ok) == []


def test_rename_exchange_swaps_two_directories_atomically_and_noreplace_refuses(tmp_path):
    from airflow_kafka_backpressure.storage import location, rename_exchange

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "f").write_text("new"), (b / "f").write_text("old")
    a_ino, b_ino = a.stat().st_ino, b.stat().st_ino
    assert rename_exchange(str(a), str(b)) is True  # Linux: tmpfs/ext4/xfs/btrfs support it
    assert (b / "f").read_text() == "new" and (a / "f").read_text() == "old"
    assert (b.stat().st_ino, a.stat().st_ino) == (a_ino, b_ino)
    c = tmp_path / "c"
    c.mkdir()
    assert location(str(c)).move_no_replace(location(str(b))) is False and c.exists()
    assert location(str(c)).move_no_replace(location(str(tmp_path / "d"))) is True and not c.exists()
    with pytest.raises(FileNotFoundError):
        rename_exchange(str(tmp_path / "nope"), str(b))


# --------------------------------------------------------------------------- SQLite across hosts


def test_multi_host_executors_are_read_from_the_executor_list():
    from airflow_kafka_backpressure.hooks.ledger import multi_host_executors, multi_host_refusal

    assert multi_host_executors("LocalExecutor") == []
    assert multi_host_executors("") == []
    assert multi_host_executors(" LocalExecutor , CeleryExecutor") == ["CeleryExecutor"]
    assert (
        multi_host_executors(
            "airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor"
        )
        != []
    )
    assert multi_host_executors("LocalExecutor,edge:airflow.providers.edge3.executors.EdgeExecutor") == [
        "edge:airflow.providers.edge3.executors.EdgeExecutor"
    ]
    assert multi_host_executors("my.company.LocalishExecutor") == []
    url = "sqlite:////data/ledger.db"
    assert multi_host_refusal(url, "x", "LocalExecutor", False) is None
    assert multi_host_refusal("postgresql://u:p@h/db", "x", "CeleryExecutor", True) is None
    assert multi_host_refusal("sqlite:///:memory:", None, "CeleryExecutor", False) is None
    msg = multi_host_refusal(url, "x", "CeleryExecutor", False)
    assert "connection 'x' is a SQLite file (/data/ledger.db)" in msg and "CeleryExecutor" in msg
    assert "Set the pipeline's ledger_conn_id" in msg
    assert "remote_triggerer = True" in multi_host_refusal(url, None, "LocalExecutor", True)
