"""Fencing of sink commits and adoption of a committed batch (runs where the sink writer runs: the
Spark driver side of the write, or a Spark task).

**Fencing.** Each attempt at a batch has the ledger's attempt number (it grows by one whenever an
attempt claims the batch: a retry, a replay, a takeover of an abandoned one). The writer of attempt
``n`` raises the batch's fence ``<sink>/_kbp_fence_<N>/`` to ``n`` when its write starts (a marker
file of its own, ``<n>_<token>``: the fence is the highest marker, so it can only rise), and its
commit refuses to publish when

* the fence is above ``n`` — a newer attempt has started writing the batch since, or
* the committed version's manifest was written by an attempt above ``n``,

so an older attempt (a retry's predecessor still running, a worker that lost its lease) can never
commit over a newer one. Once attempt ``n`` has committed, the markers of ``n`` and older attempts
are redundant (the committed manifest's attempt refuses every older attempt) and its commit removes
them, and the fence directory once empty (:func:`clear_fence`): the sink root does not keep one
directory per batch. A newer attempt's marker stays: it still fences the attempts between. The check and the swap are separate steps: two commits racing within
milliseconds are ordered by the swap itself (both versions hold the same planned ranges). The fence
file starts with ``_``: dataset readers skip it. Writes without an attempt number (direct
:func:`~.write.write_batch` calls) are not fenced.

**Adoption.** A worker that died between the sink swap and marking the batch in the ledger leaves
a complete committed version. :func:`adoption_problems` says whether a committed manifest is one —
same pipeline, the planned ranges (or those the replay would write), every listed file present at
its listed size — so the replay takes it over instead of reading Kafka again, whichever attempt
wrote it (a later replay that died before its own check must not make it unadoptable).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.storage import Location

#: the error table's files of a batch, inside its directory (a decoded batch's bad records)
ERRORS_DIR = "_errors"

FENCE_PREFIX = "_kbp_fence_"

__all__ = [
    "adoption_problems",
    "clear_fence",
    "fence_markers",
    "fence_problem",
    "file_problems",
    "raise_fence",
    "read_fence",
]


def fence_location(root: Location, batch_id: int) -> Location:
    """The batch's fence: a directory of one marker per attempt that started writing."""
    return root.child(f"{FENCE_PREFIX}{int(batch_id)}")


def _legacy_fence(root: Location, batch_id: int) -> Location:
    return root.child(f"{FENCE_PREFIX}{int(batch_id)}.json")  # one file, rewritten (before 2026-11-25)


def fence_markers(root: Location, batch_id: int) -> dict[str, int]:
    """``{token: attempt}`` of every attempt that raised the batch's fence."""
    out: dict[str, int] = {}
    for name, is_dir, _ in fence_location(root, batch_id).children():
        attempt, _, token = name.partition("_")
        if not is_dir and attempt.isdigit() and token:
            out[token] = int(attempt)
    return out


def read_fence(root: Location, batch_id: int) -> int | None:
    """The highest attempt number that started writing ``batch_id`` (None: no fenced write yet)."""
    attempts = list(fence_markers(root, batch_id).values())
    legacy = _legacy_fence(root, batch_id)
    if legacy.exists():
        attempts.append(int(json.loads(legacy.read_bytes())["attempt"]))
    return max(attempts) if attempts else None


def raise_fence(root: Location, batch_id: int, attempt: int, token: str) -> str | None:
    """Record that attempt ``attempt`` starts writing; a problem message if a newer one already did.

    Each attempt adds its own marker (``<attempt>_<token>``) and never rewrites another's, so the
    fence only ever rises, whatever the order in which racing attempts get here (a single fence
    file read and then rewritten let an older attempt lower it under a newer one). The check after
    writing sees every newer attempt that wrote its marker first; one that writes later is refused
    by its own commit's check (:func:`fence_problem` reads the highest marker)."""
    current = read_fence(root, batch_id)
    if current is not None and current > attempt:
        return _newer(batch_id, attempt, token, f"attempt {current} started writing it")
    marker = fence_location(root, batch_id).child(f"{int(attempt):010d}_{token}")
    if not marker.exists():
        marker.write_bytes(json.dumps({"attempt": int(attempt), "token": token}).encode())
    current = read_fence(root, batch_id)
    if current is not None and current > attempt:
        return _newer(batch_id, attempt, token, f"attempt {current} started writing it")
    return None


def clear_fence(root: Location, batch_id: int, attempt: int) -> None:
    """After attempt ``attempt`` committed ``batch_id``: delete its fence marker and those of older
    attempts, then the fence directory if nothing is left in it (see the module doc). Racing a newer
    attempt that raises the fence meanwhile is safe: its marker is never deleted, and the directory
    goes only while empty (an attempt that finds it gone creates it again)."""
    fence = fence_location(root, batch_id)
    for name, is_dir, _ in fence.children():
        theirs, _, token = name.partition("_")
        if not is_dir and theirs.isdigit() and token and int(theirs) <= attempt:
            fence.child(name).delete()
    legacy = _legacy_fence(root, batch_id)
    if legacy.exists() and int(json.loads(legacy.read_bytes())["attempt"]) <= attempt:
        legacy.delete()
    fence.remove_if_empty()


def fence_problem(
    batch_id: int, attempt: int | None, token: str, fence: int | None, existing: dict[str, Any] | None
) -> str | None:
    """Why attempt ``attempt`` must not commit (pure): a newer attempt raised the ``fence`` or wrote
    the ``existing`` committed version. None: it may commit."""
    if attempt is None:
        return None
    if fence is not None and fence > attempt:
        return _newer(batch_id, attempt, token, f"attempt {fence} started writing it")
    theirs = None if existing is None else existing.get("attempt")
    if existing is not None and theirs is not None and int(theirs) > attempt:
        return _newer(
            batch_id,
            attempt,
            token,
            f"attempt {theirs} (token {str(existing.get('token'))[:8]}…) committed it",
        )
    return None


def _newer(batch_id: int, attempt: int, token: str, what: str) -> str:
    return (
        f"batch {batch_id}: attempt {attempt} (token {token[:8]}…) is older than the batch's newest attempt: "
        f"{what}. This attempt's output is discarded (fencing); the newest attempt decides the batch. "
        f"(Only if the ledger was reset or moved — its attempt numbers restarted — delete the sink's "
        f"{FENCE_PREFIX}{int(batch_id)} directory and run the batch again.)"
    )


def adoption_problems(
    manifest: dict[str, Any] | None, pipeline: str, *accepted: Sequence[OffsetRange]
) -> list[str]:
    """Why ``manifest`` is not a committed output of ``pipeline``'s batch for one of the
    ``accepted`` range sets (pure; files are checked by :func:`file_problems`). Empty: adopt it,
    whichever attempt wrote it (the adopting replay holds the batch: no newer attempt is live)."""
    if manifest is None:
        return ["no committed version"]
    problems = []
    if manifest.get("pipeline") != pipeline:
        problems.append(f"written for pipeline {manifest.get('pipeline')!r}")
    theirs = sorted(OffsetRange.from_dict(r) for r in manifest.get("ranges", ()))
    if not any(theirs == sorted(ranges) for ranges in accepted):
        problems.append(f"ranges {', '.join(map(str, theirs)) or 'none'} differ from the plan")
    if not manifest.get("files"):
        problems.append("lists no files")
    return problems


def file_problems(batch_dir: Location, manifest: dict[str, Any]) -> list[str]:
    """Files the manifest lists that are missing or have another size: the batch's data files and
    its error table's (``error_files``, in ``_errors/``: a replay that adopts the batch adopts its
    bad records too, so they must all be there)."""
    out = []
    listed = [("", manifest.get("files", ()))]
    if manifest.get("error_files"):
        listed.append((ERRORS_DIR, manifest["error_files"]))
    for folder, files in listed:
        where = batch_dir.child(folder) if folder else batch_dir
        sizes = (
            {name: size for name, is_dir, size in where.children() if not is_dir} if where.exists() else {}
        )
        for f in files:
            name = f"{folder}/{f['name']}" if folder else f["name"]
            if f["name"] not in sizes:
                out.append(f"{name} is missing")
            elif int(sizes[f["name"]]) != int(f["bytes"]):
                out.append(f"{name} has {sizes[f['name']]} bytes, the manifest says {f['bytes']}")
    return out
