"""The embedded broker's KRaft cluster id (``kafka-storage format --cluster-id``)."""

import base64

from kbp_local.apache_kafka import new_cluster_id


def test_a_cluster_id_never_starts_with_a_dash_and_is_a_uuid() -> None:
    # One draw in 64 of a raw URL-safe base64 UUID starts with "-", which the storage tool reads as
    # an option; 3,000 draws without the redraw would all miss it with probability (63/64)**3000 < 1e-20.
    ids = [new_cluster_id() for _ in range(3000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
