"""A topic deleted and created again, the pure rules (issue 21, item 1)."""

from __future__ import annotations

import pytest

from airflow_kafka_backpressure.batch.models import BatchPlan, DataLoss, OffsetRange
from airflow_kafka_backpressure.ledger.topic_identity import (
    archived_name,
    changed_topics,
    reset_refusal,
    topic_reset_decision,
)


def _plan(**ids: str) -> BatchPlan:
    ranges = [
        OffsetRange("orders", 0, 100, 150),
        OffsetRange("orders", 1, 90, 90),
        OffsetRange("clicks", 0, 5, 25),
    ]
    return BatchPlan("p", 7, "run-7", ranges, "/sink", 60_000, 0, topic_ids=ids)


def test_only_a_recorded_id_that_differs_is_a_change():
    known = {"orders": "id-a", "clicks": "id-c"}
    assert changed_topics(known, {"orders": "id-b", "clicks": "id-c"}) == {"orders": ("id-a", "id-b")}
    assert changed_topics(known, {"orders": None}) == {}  # missing on the broker: its own error elsewhere
    assert changed_topics({}, {"orders": "id-b"}) == {}  # never planned, or planned before ids were kept


def test_the_plan_keeps_its_topic_ids_through_json():
    plan = _plan(orders="id-a", clicks="id-c")
    assert BatchPlan.from_json(plan.to_json()).topic_ids == {"clicks": "id-c", "orders": "id-a"}
    assert BatchPlan.from_dict({k: v for k, v in plan.to_dict().items() if k != "topic_ids"}).topic_ids == {}


def test_earliest_gives_up_the_recreated_topics_ranges_and_keeps_the_rest():
    d = topic_reset_decision(
        _plan(orders="id-a", clicks="id-c"), {"orders": "id-b", "clicks": "id-c"}, "earliest"
    )
    assert d.refusal is None
    assert d.lost == (DataLoss("orders", 0, 100, 150),)  # the empty range of partition 1 loses nothing
    assert [r for r in d.ranges if r.count] == [OffsetRange("clicks", 0, 5, 25)]


def test_fail_refuses_with_the_topic_both_ids_and_the_way_out():
    d = topic_reset_decision(_plan(orders="id-a"), {"orders": "id-b"}, "fail", ledger_conn_id="kbp_ledger")
    assert d.refusal is not None
    for text in (
        "'orders'",
        "id-a",
        "id-b",
        "batch 7",
        "on_topic_reset",
        "abandon --conn-id kbp_ledger --batch 7",
    ):
        assert text in d.refusal, text


def test_a_plan_without_ids_or_an_unchanged_topic_is_read_as_planned():
    plan = _plan()
    assert topic_reset_decision(plan, {"orders": "id-b"}, "fail").ranges == plan.ranges
    same = _plan(orders="id-a")
    assert topic_reset_decision(same, {"orders": "id-a"}, "fail").lost == ()
    with pytest.raises(ValueError, match="on_topic_reset"):
        topic_reset_decision(same, {}, "latest")


def test_an_archived_name_is_no_kafka_topic_name_and_fits_the_ledger():
    name = archived_name("t" * 249, "0123456789abcdef")
    assert "#" in name and len(name) <= 249 and name.endswith("#01234567")
    assert "earliest" in reset_refusal("p", {"orders": ("a", "b")}, "planned")
