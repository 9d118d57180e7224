"""The monitoring page inside a real Airflow API server app (in process), on a real ledger.

Airflow's own FastAPI app is built with ``airflow.api_fastapi.app.create_app`` (what ``airflow
api-server`` serves): the plugin comes in through the ``airflow.plugins`` entry point of the installed
package, the simple auth manager issues tokens at ``POST /auth/token``, the ledger is a SQLite file
named by an Airflow connection (``KBP_LEDGER_CONN_ID``), the Variables live in the metadata DB.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_kafka_backpressure.batch.models import OffsetRange
from airflow_kafka_backpressure.ledger import Ledger

PREFIX = "/kafka-backpressure"
P = "ui-orders"
OTHER = "ui-clicks"
TOPIC = "orders-events"
INTERVAL_MS = 10_000
REPO = Path(__file__).resolve().parents[2]
EVIL = "</script><script>alert('kbp')</script><img src=x onerror=alert(1)> & \"quoted\"\nline two"
SETTINGS = {"scaling_up_ratio": 0.8, "scaling_down_ratio": 0.25, "proportional": 1.0}
CONTROLLER = {
    "spark": {"rate_limit": 321, "last_batch": 2, "estimator": {"latest_rate": 321.5}},
    "mode": "cost",
    "cost": {
        "correction": {
            "error": 0.05,
            "integral": 0.1,
            "previous_error": None,
            "terms": {
                "error": 0.05,
                "proportional": 0.05,
                "integral": 0.02,
                "derivative": 0.0,
                "output": 0.07,
            },
        }
    },
    "waiting": {
        "available": 20,
        "min_records": 100,
        "last_planned_at_ms": 1,
        "batch_by_ms": 2,
        "checked_at_ms": 1,
    },
    "last_plan": {
        "mode": "cost",
        "rate": 2306.0,
        "regime": "drain",
        "reason": "drain: backlog",
        "budget_records": 23060,
        "correction": 0.01,
        "batch_id": 2,
        "planned_at_ms": 1,
    },
}
#: what the maintenance task keeps of its last run (operators/maintain.py)
MAINTENANCE = {
    "run_id": "scheduled__2026-01-02T03:00:00+00:00",
    "at": "2026-01-02T03:00:00+00:00",
    "tables": [
        {"table": "/data/t", "format": "delta", "after": {"kbp_day=2026-01-01": {"files": 1, "bytes": 2048}}}
    ],
}
TARGET = {
    "executors": 3,
    "changed_after_batch": 2,
    "last_decision": {"action": "up", "reason": "ratio 0.95 >= 0.8"},
}


def _fill_ledger(url: str) -> dict[str, int]:
    """Four batches of P (succeeded, succeeded, failed with a malicious error, planned), one of OTHER."""
    led = Ledger(url)
    led.create_all()

    def plan(pipeline: str, run_id: str, start: int, end: int, rate: float, lag: int) -> int:
        return led.record_plan(
            pipeline,
            run_id,
            [OffsetRange(TOPIC if pipeline == P else "clicks", 0, start, end)],
            f"/sink/{pipeline}",
            batch_interval_ms=INTERVAL_MS,
            planned_at_ms=1_000,
            rate=rate,
            lag=lag,
        ).batch_id

    ids = {}
    ids["ok1"] = b = plan(P, "run-1", 0, 1000, 250.0, 500)
    led.mark_running(b, executors=2)
    led.record_metrics(b, scheduling_delay_ms=120)
    led.mark_succeeded(b, records=1000, processing_ms=4000)
    ids["ok2"] = b = plan(P, "run-2", 1000, 3000, 400.0, 50)
    led.mark_running(b, executors=3)
    led.record_metrics(b, scheduling_delay_ms=900, bad_records=3)
    led.mark_succeeded(b, records=2000, processing_ms=9500)
    ids["failed"] = b = plan(P, "run-3", 3000, 3500, 321.0, 7000)
    led.mark_running(b, executors=3)
    led.mark_failed(b, EVIL)
    ids["planned"] = plan(P, "run-4", 3500, 4000, 321.0, 6500)
    ids["other"] = plan(OTHER, "run-1", 0, 10, 5.0, 0)
    led.dispose()
    return ids


@pytest.fixture(scope="module")
def airflow_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ui-plugin")
    ledger_url = f"sqlite:///{tmp / 'ledger.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER",
        "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    )
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp / "passwords.json"))
    mp.setenv("AIRFLOW__CORE__PLUGINS_FOLDER", str(tmp / "plugins"))
    mp.setenv(
        "AIRFLOW_CONN_KBP_UI_LEDGER",
        json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": ledger_url}}),
    )
    mp.setenv("KBP_LEDGER_CONN_ID", "kbp_ui_ledger")
    # Discover entry points as `airflow api-server` does: its sys.path holds the venv, not the checkout.
    # pytest puts the repository root on sys.path, where `pip install -e .` leaves a build-time
    # *.egg-info: importlib.metadata would then list the package twice (two "distributions" with the
    # same entry point) and Airflow would log "already registered" for the second copy.
    mp.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != REPO])
    # PINNED INTERNAL (test only): Airflow caches entry points per process and has no public way to
    # re-read them after sys.path changed.
    from airflow._shared.module_loading import _get_grouped_entry_points

    _get_grouped_entry_points.cache_clear()
    try:
        from airflow import plugins_manager
        from airflow.api_fastapi.app import create_app, purge_cached_app
        from airflow.models import Variable
        from airflow.utils import db
        from fastapi.testclient import TestClient

        db.initdb()  # creates the metadata DB if missing, never wipes it
        for suffix, value in (
            ("settings", SETTINGS),
            ("controller_state", CONTROLLER),
            ("executor_target", TARGET),
            ("maintenance", MAINTENANCE),
        ):
            Variable.set(f"kbp.{P}.{suffix}", json.dumps(value))
        ids = _fill_ledger(ledger_url)

        for cached in (
            plugins_manager._get_plugins,
            plugins_manager.get_fastapi_plugins,
            plugins_manager._get_ui_plugins,
        ):
            cached.cache_clear()
        purge_cached_app()
        app = create_app(apps="core")
        with TestClient(app) as client:
            passwords = json.loads((tmp / "passwords.json").read_text())
            tokens = {}
            for user in ("admin", "viewer"):
                resp = client.post("/auth/token", json={"username": user, "password": passwords[user]})
                assert resp.status_code == 201, resp.text
                tokens[user] = resp.json()["access_token"]
            yield {"client": client, "tokens": tokens, "ids": ids, "ledger_url": ledger_url}
    finally:
        try:
            from airflow.models import Variable

            for suffix in ("settings", "controller_state", "executor_target", "maintenance"):
                Variable.delete(f"kbp.{P}.{suffix}")
        except Exception:
            pass
        mp.undo()
        _get_grouped_entry_points.cache_clear()


def _get(ctx: dict[str, Any], path: str, user: str | None = "admin", **kw: Any):
    headers = {"Authorization": f"Bearer {ctx['tokens'][user]}"} if user else {}
    return ctx["client"].get(path, headers=headers, **kw)


def _boot(page: str) -> dict[str, Any]:
    """The data the page embeds for its script."""
    return json.loads(
        re.search(r'<script type="application/json" id="kbp-boot">(.*?)</script>', page, re.S).group(1)
    )


def test_plugin_is_discovered_once_through_its_entry_point(airflow_app: dict[str, Any]) -> None:
    from airflow import plugins_manager
    from airflow.providers_manager import ProvidersManager

    from airflow_kafka_backpressure.get_provider_info import get_provider_info

    plugins, errors = plugins_manager._get_plugins()
    ours = [p for p in plugins if p.name == "kafka_backpressure"]
    assert len(ours) == 1
    assert "group='airflow.plugins'" in str(ours[0].source)  # from the entry point, not a plugins folder
    assert not [e for e in errors.values() if "kafka_backpressure" in e], errors
    # Not declared by the provider too (that would register it a second time).
    assert "plugins" not in get_provider_info()
    pm = ProvidersManager()
    pm.initialize_providers_plugins()
    assert not [p for p in pm.plugins if "kafka_backpressure" in p.plugin_class]

    resp = _get(airflow_app, "/api/v2/plugins")
    assert resp.status_code == 200, resp.text
    listed = [p for p in resp.json()["plugins"] if p["name"] == "kafka_backpressure"]
    assert len(listed) == 1
    assert [a["url_prefix"] for a in listed[0]["fastapi_apps"]] == [PREFIX]
    (view,) = listed[0]["external_views"]
    assert view["url_route"] == "kafka-backpressure"
    assert view["href"] == PREFIX + "/"
    assert view["category"] == "browse"
    assert view["destination"] == "nav"
    errors_resp = _get(airflow_app, "/api/v2/plugins/importErrors")
    assert errors_resp.status_code == 200
    assert not [e for e in errors_resp.json()["import_errors"] if "kafka_backpressure" in json.dumps(e)]
    # The UI's route for the embedded page answers with the single-page app.
    ui = airflow_app["client"].get("/plugin/kafka-backpressure")
    assert ui.status_code == 200 and "text/html" in ui.headers["content-type"]


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/pipelines",
        f"/pipelines/{P}/batches",
        f"/pipelines/{P}/replayable",
        f"/pipelines/{P}/state",
        f"/pipelines/{P}/overview",
        "/pipelines/no-such-pipeline/batches",
    ],
)
def test_every_endpoint_needs_a_token(airflow_app: dict[str, Any], path: str) -> None:
    client = airflow_app["client"]
    assert _get(airflow_app, PREFIX + path, user=None).status_code == 401
    # An invalid token is refused too (Airflow answers 403 "Invalid JWT token"), as is a bad cookie.
    assert client.get(PREFIX + path, headers={"Authorization": "Bearer not-a-jwt"}).status_code in (401, 403)
    client.cookies.set("_token", "not-a-jwt")
    try:
        assert client.get(PREFIX + path).status_code in (401, 403)
    finally:
        client.cookies.clear()


def test_pipelines_and_batches_json_hold_the_ledger_numbers(airflow_app: dict[str, Any]) -> None:
    ids = airflow_app["ids"]
    resp = _get(airflow_app, PREFIX + "/pipelines")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["ledger"]["conn_id"] == "kbp_ui_ledger"
    assert [p["name"] for p in body["pipelines"]] == [OTHER, P]
    assert body["pipelines"][1]["latest_batch"]["batch_id"] == ids["planned"]

    resp = _get(airflow_app, PREFIX + f"/pipelines/{P}/batches", params={"limit": 10})
    assert resp.status_code == 200, resp.text
    batches = resp.json()["batches"]
    assert [b["batch_id"] for b in batches] == [ids["planned"], ids["failed"], ids["ok2"], ids["ok1"]]
    by_id = {b["batch_id"]: b for b in batches}
    ok1, ok2, failed, planned = (by_id[ids[k]] for k in ("ok1", "ok2", "failed", "planned"))
    assert ok1["status"] == "succeeded" and ok1["records"] == 1000 and ok1["processing_ms"] == 4000
    assert ok1["rate"] == 250.0 and ok1["executors"] == 2 and ok1["scheduling_delay_ms"] == 120
    assert ok1["batch_interval_ms"] == INTERVAL_MS and ok1["lag"] == 500 and ok1["planned_records"] == 1000
    assert ok1["processing_ratio"] == pytest.approx(0.4) and ok1["records_per_s"] == pytest.approx(250.0)
    assert ok2["processing_ratio"] == pytest.approx(0.95) and ok2["records_per_s"] == pytest.approx(
        2000 / 9.5
    )
    assert (
        ok2["rate"] == 400.0
        and ok2["executors"] == 3
        and ok2["scheduling_delay_ms"] == 900
        and ok2["lag"] == 50
    )
    assert failed["status"] == "failed" and failed["error"] == EVIL and failed["records"] is None
    assert failed["processing_ratio"] is None and failed["lag"] == 7000
    # bad records where the batch was decoded (none recorded: nothing decoded)
    assert ok2["bad_records"] == 3 and ok1["bad_records"] is None
    # the arrival rate, per second of input like the rate limit: none for the oldest batch shown
    assert ok1["arrival_per_s"] is None and all(isinstance(b["arrival_per_s"], float) for b in (ok2, failed))
    assert planned["status"] == "planned" and planned["attempts"] == 0
    assert planned["plan"]["ranges"] == [
        {"topic": TOPIC, "partition": 0, "from_offset": 3500, "until_offset": 4000}
    ]

    newest = _get(airflow_app, PREFIX + f"/pipelines/{P}/batches", params={"limit": 2}).json()["batches"]
    assert [b["batch_id"] for b in newest] == [ids["planned"], ids["failed"]]
    only_ok = _get(airflow_app, PREFIX + f"/pipelines/{P}/batches", params={"status": "succeeded"}).json()[
        "batches"
    ]
    assert [b["batch_id"] for b in only_ok] == [ids["ok2"], ids["ok1"]]
    assert (
        _get(airflow_app, PREFIX + f"/pipelines/{P}/batches", params={"status": "bogus"}).status_code == 400
    )
    assert _get(airflow_app, PREFIX + f"/pipelines/{P}/batches", params={"limit": 0}).status_code == 422
    assert _get(airflow_app, PREFIX + "/pipelines/no-such-pipeline/batches").status_code == 404


def test_replayable_batches(airflow_app: dict[str, Any]) -> None:
    ids = airflow_app["ids"]
    resp = _get(airflow_app, PREFIX + f"/pipelines/{P}/replayable")
    assert resp.status_code == 200, resp.text
    (failed,) = resp.json()["batches"]
    assert failed["batch_id"] == ids["failed"] and failed["reason"] == "failed" and failed["error"] == EVIL
    time.sleep(0.01)
    stale = _get(airflow_app, PREFIX + f"/pipelines/{P}/replayable", params={"stale_after_s": 0.001}).json()
    assert [(b["batch_id"], b["reason"]) for b in stale["batches"]] == [
        (ids["failed"], "failed"),
        (ids["planned"], "stale"),
    ]


def test_state_shows_variables_only_to_users_who_may_read_them(airflow_app: dict[str, Any]) -> None:
    admin = _get(airflow_app, PREFIX + f"/pipelines/{P}/state")
    assert admin.status_code == 200, admin.text
    body = admin.json()
    assert body["variables"]["settings"] == {
        "key": f"kbp.{P}.settings",
        "readable": True,
        "exists": True,
        "value": SETTINGS,
        "error": None,
    }
    assert body["variables"]["controller_state"]["value"] == CONTROLLER
    assert body["variables"]["executor_target"]["value"] == TARGET
    assert body["variables"]["maintenance"]["value"] == MAINTENANCE  # the last maintenance's report
    assert body["thresholds"] == {"scaling_up_ratio": 0.8, "scaling_down_ratio": 0.25, "source": "settings"}
    assert body["current"] == {
        "executors": 3,
        "last_decision": TARGET["last_decision"],
        # issue 23: the mode that plans and its cards (the cost mode's budget and correction terms), a
        # run waiting for data
        "mode": "cost",
        "cards": [
            {
                "title": "Batch budget (cost mode)",
                "value": "2,306 /s",
                "detail": "regime drain, 23,060 records, batch #2: drain: backlog",
            },
            {
                "title": "Correction (PID)",
                "value": "7.0% of the interval",
                "detail": "error 5.0%: P 5.0 + I 2.0 + D 0.0 (points of the interval added to the drain cap)",
            },
        ],
        "waiting": CONTROLLER["waiting"],
        "last_plan": CONTROLLER["last_plan"],  # the figure that planned and its regime (issue 23 item 4)
    }

    # The simple auth manager lets a viewer read DAG runs (so batches) but not Variables.
    viewer = _get(airflow_app, PREFIX + f"/pipelines/{P}/overview", user="viewer")
    assert viewer.status_code == 200, viewer.text
    vbody = viewer.json()
    assert len(vbody["batches"]) == 4
    assert all(not v["readable"] and v["value"] is None for v in vbody["variables"].values())
    assert vbody["thresholds"]["source"] == "default"
    assert vbody["current"] == {
        "executors": None,
        "last_decision": None,
        "mode": None,
        "cards": [],
        "waiting": None,
        "last_plan": None,
    }

    other = _get(airflow_app, PREFIX + f"/pipelines/{OTHER}/state").json()
    assert all(v["readable"] and not v["exists"] for v in other["variables"].values())
    assert other["thresholds"] == {"scaling_up_ratio": 0.9, "scaling_down_ratio": 0.3, "source": "default"}


def test_page_renders_with_the_ui_cookie_and_escapes_ledger_text(airflow_app: dict[str, Any]) -> None:
    client = airflow_app["client"]
    client.cookies.set("_token", airflow_app["tokens"]["admin"])  # what the Airflow UI's iframe sends
    try:
        resp = client.get(PREFIX + "/", params={"pipeline": P, "limit": 50})
    finally:
        client.cookies.clear()
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    page = resp.text
    for plot in ("plot-rate", "plot-records", "plot-ratio", "plot-delay", "plot-executors", "plot-lag"):
        assert f'<svg id="{plot}"' in page
    for table in ("kbp-batches", "kbp-replayable", "kbp-vars", "kbp-lag"):
        assert f'id="{table}"' in page
    # the cards of the mode that plans (issue 23), as the mode gives them (control/modes), and the page's own
    cards = [c["title"] for c in _boot(page)["overview"]["current"]["cards"]]
    assert cards == ["Batch budget (cost mode)", "Correction (PID)"]
    assert "cur.cards" in page and "Waiting for data" in page
    # No external resource: everything inline.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    csp = resp.headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)
    assert (
        f'<script nonce="{nonce}">' in page
        and "default-src 'none'" in csp
        and "frame-ancestors 'self'" in csp
    )

    # The malicious error text never appears as markup ...
    assert "<script>alert" not in page and "<img src=x" not in page and "</script><script>" not in page
    assert "\\u003c/script\\u003e\\u003cscript\\u003ealert('kbp')" in page
    # ... and reads back exactly from the embedded data (the JS sets it with textContent).
    boot = _boot(page)
    assert boot["selected"] == P and boot["limit"] == 50
    assert [b["error"] for b in boot["overview"]["batches"] if b["status"] == "failed"] == [EVIL]
    assert boot["overview"]["thresholds"]["scaling_up_ratio"] == 0.8
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page

    # A pipeline name in the query is data too.
    client.cookies.set("_token", airflow_app["tokens"]["admin"])
    try:
        odd = client.get(PREFIX + "/", params={"pipeline": "<b>x</b>"})
    finally:
        client.cookies.clear()
    assert odd.status_code == 200 and "<b>x</b>" not in odd.text


def test_pipeline_data_needs_read_access_to_its_ingest_dag_runs(
    airflow_app: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    allowed = manager.is_authorized_dag
    asked = []

    def only_other(*, method, access_entity=None, details=None, user):
        asked.append((method, access_entity.name if access_entity else None, details.id if details else None))
        if details is not None and details.id == f"kbp_ingest_{P}":
            return False
        return allowed(method=method, access_entity=access_entity, details=details, user=user)

    monkeypatch.setattr(manager, "is_authorized_dag", only_other)
    assert [p["name"] for p in _get(airflow_app, PREFIX + "/pipelines").json()["pipelines"]] == [OTHER]
    for path in ("batches", "replayable", "state", "overview"):
        resp = _get(airflow_app, PREFIX + f"/pipelines/{P}/{path}")
        assert resp.status_code == 403, (path, resp.text)
    assert _get(airflow_app, PREFIX + f"/pipelines/{OTHER}/batches").status_code == 200
    assert ("GET", "RUN", f"kbp_ingest_{P}") in asked
    page = _get(airflow_app, PREFIX + "/", params={"pipeline": P})
    assert page.status_code == 200
    boot = _boot(page.text)
    assert boot["selected"] == OTHER and [p["name"] for p in boot["pipelines"]] == [OTHER]
    assert "may not read it" in boot["error"]


# ---- lag and retention risk, read from the real embedded broker (kept last: it adds a pipeline) --------


def _pipelines_file(tmp_path: Path, name: str, topic: str, conn_id: str) -> Path:
    path = tmp_path / "pipelines.json"
    path.write_text(
        json.dumps(
            {
                "pipelines": [
                    {
                        "name": name,
                        "topics": [topic],
                        "sink": str(tmp_path / "sink"),
                        "kafka_conn_id": conn_id,
                    }
                ]
            }
        )
    )
    return path


def test_lag_endpoint_shows_each_partitions_lag_and_retention_risk_from_the_broker(
    airflow_app: dict[str, Any],
    kafka_broker,
    topic_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_kafka_backpressure.batch.models import TopicPartition
    from airflow_kafka_backpressure.hooks.kafka_offsets import KafkaOffsetsHook
    from kbp_local.producer import ensure_topic, produce

    name = "ui-lag"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_UI_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_broker.bootstrap}}),
    )
    monkeypatch.setenv("KBP_PIPELINES_FILE", str(_pipelines_file(tmp_path, name, topic_name, "kbp_ui_kafka")))
    ensure_topic(kafka_broker.bootstrap, topic_name, 2)
    before_ms = int(time.time() * 1000)
    produce(kafka_broker.bootstrap, topic_name, count=20, partitions=2)  # 10 records per partition
    after_ms = int(time.time() * 1000)
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with KafkaOffsetsHook("kbp_ui_kafka").get_conn() as kafka:
        kafka.commit_offsets(f"kbp-{name}", {tp0: 4, tp1: 10})  # partition 1 fully written
    led = Ledger(airflow_app["ledger_url"])
    led.record_plan(
        name,
        "run-1",
        [OffsetRange(topic_name, 0, 0, 6), OffsetRange(topic_name, 1, 0, 10)],
        "/sink/x",
        1000,
        0,
    )

    resp = _get(airflow_app, PREFIX + f"/pipelines/{name}/lag", params={"retention_margin_records": 4})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (
        body["group"] == f"kbp-{name}" and body["kafka_conn_id"] == "kbp_ui_kafka" and body["total_lag"] == 6
    )
    p0, p1 = body["partitions"]
    assert (p0["earliest"], p0["position"], p0["head"], p0["latest"], p0["lag"], p0["in_flight"]) == (
        0,
        4,
        6,
        10,
        6,
        2,
    )
    assert p0["position_source"] == "committed" and p0["retention_margin"] == 4 and p0["at_risk"] is True
    assert before_ms <= p0["oldest_unwritten_ts_ms"] <= after_ms and p0["seconds_behind"] >= 0
    assert (p1["position"], p1["lag"], p1["seconds_behind"], p1["at_risk"]) == (10, 0, 0.0, False)
    assert body["at_risk"] == [f"{topic_name}-0"]
    # With a smaller margin the same offsets are not at risk.
    relaxed = _get(
        airflow_app, PREFIX + f"/pipelines/{name}/lag", params={"retention_margin_records": 3}
    ).json()
    assert relaxed["at_risk"] == [] and relaxed["partitions"][0]["at_risk"] is False
    assert _get(airflow_app, PREFIX + f"/pipelines/{name}/lag", user=None).status_code == 401


def test_lag_endpoint_says_which_connection_does_not_answer(
    airflow_app: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kbp_local.process import free_port

    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_UI_DEAD",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": dead, "sasl.password": "s3cret"}}),
    )
    monkeypatch.setenv("KBP_PIPELINES_FILE", str(_pipelines_file(tmp_path, P, TOPIC, "kbp_ui_dead")))
    resp = _get(airflow_app, PREFIX + f"/pipelines/{P}/lag")
    assert resp.status_code == 503
    detail = resp.json()["detail"]
    assert "kbp_ui_dead" in detail and dead in detail and "s3cret" not in detail


def test_losses_endpoint_lists_recorded_losses_with_counts(airflow_app: dict[str, Any]) -> None:
    from airflow_kafka_backpressure.batch.models import DataLoss
    from airflow_kafka_backpressure.ledger import Ledger

    ids = airflow_app["ids"]
    assert _get(airflow_app, PREFIX + f"/pipelines/{P}/losses", user=None).status_code == 401
    assert _get(airflow_app, PREFIX + f"/pipelines/{P}/losses").json()["losses"] == []
    led = Ledger(airflow_app["ledger_url"])
    try:
        r = led.batch(ids["failed"]).ranges[0]
        led.record_losses(
            ids["failed"], [DataLoss(r.topic, r.partition, r.from_offset, r.from_offset + 5)], "retention"
        )
    finally:
        led.dispose()
    resp = _get(airflow_app, PREFIX + f"/pipelines/{P}/losses")
    assert resp.status_code == 200, resp.text
    (batch,) = resp.json()["losses"]
    assert batch["batch_id"] == ids["failed"] and batch["status"] == "failed" and batch["lost"] == 5
    assert [(s["from_offset"], s["until_offset"], s["kind"], s["reason"]) for s in batch["spans"]] == [
        (r.from_offset, r.from_offset + 5, "replay", "retention")
    ]
    assert _get(airflow_app, PREFIX + f"/pipelines/{P}/overview").json()["losses"] == [batch]


# ---- reads have no side effects, and the lag never piles up (issue 21, item 5) ---------------------


def test_a_viewer_never_creates_or_migrates_the_ledger(
    airflow_app: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any viewer's first request used to run the ledger's migrations (DDL, locks) in the API server.
    Readers now say "not initialised" and what to run; a writer or the upgrade command fixes it."""
    from sqlalchemy import create_engine, inspect

    from airflow_kafka_backpressure.ledger.__main__ import main as ledger_main

    db = tmp_path / "fresh" / "ledger.db"
    url = f"sqlite:///{db}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KBP_UI_FRESH", json.dumps({"conn_type": "generic", "extra": {"sqlalchemy_url": url}})
    )
    monkeypatch.setenv("KBP_LEDGER_CONN_ID", "kbp_ui_fresh")

    resp = _get(airflow_app, PREFIX + "/pipelines")
    assert resp.status_code == 503, resp.text
    detail = resp.json()["detail"]
    assert "not initialised" in detail and "airflow_kafka_backpressure.ledger upgrade" in detail, detail
    assert not db.exists()  # nothing created, not even the SQLite file
    boot = _boot(_get(airflow_app, PREFIX + "/").text)
    assert "not initialised" in boot["error"]

    # a ledger behind this release (an older revision) is shown as such, and left as it is
    db.parent.mkdir()
    old = Ledger(url)
    old.upgrade("0003")
    old.dispose()
    resp = _get(airflow_app, PREFIX + "/pipelines")
    assert resp.status_code == 503 and "older than this release" in resp.json()["detail"], resp.text
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            from airflow_kafka_backpressure.ledger.migrate import schema_state

            assert schema_state(conn).revision == "0003"
            assert "kbp_losses" in inspect(conn).get_table_names()
    finally:
        engine.dispose()

    assert ledger_main(["upgrade", "--conn-id", "kbp_ui_fresh"]) == 0  # the deploy step
    resp = _get(airflow_app, PREFIX + "/pipelines")
    assert resp.status_code == 200 and resp.json()["pipelines"] == [], resp.text


class _SilentBroker:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers: a frozen broker."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        for c in [*self.conns, self.sock]:
            c.close()


def test_lag_requests_of_a_frozen_broker_do_not_pile_up(
    airflow_app: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one request waits for a frozen broker (up to its bound), another for the same pipeline
    does not wait too: it is told at once that the lag is being read. Before, each open tab's refresh
    held one of the API server's shared threads for the whole broker timeout."""
    import threading

    frozen = _SilentBroker()
    try:
        monkeypatch.setenv(
            "AIRFLOW_CONN_KBP_UI_FROZEN",
            json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{frozen.port}"}}),
        )
        monkeypatch.setenv("KBP_PIPELINES_FILE", str(_pipelines_file(tmp_path, P, TOPIC, "kbp_ui_frozen")))
        first: dict[str, Any] = {}
        waiting = threading.Thread(
            target=lambda: first.update(resp=_get(airflow_app, PREFIX + f"/pipelines/{P}/lag"))
        )
        waiting.start()
        assert frozen.accepted.wait(60), "the first lag request never reached the broker"
        second = _get(airflow_app, PREFIX + f"/pipelines/{P}/lag")
        assert waiting.is_alive(), (
            "the first request ended before the second was answered: nothing was in flight"
        )
        assert (
            second.status_code == 503
            and "is being read from Kafka by another request" in second.json()["detail"]
        ), second.text
        assert second.headers.get("retry-after")
        waiting.join(60)
        assert not waiting.is_alive()
        assert first["resp"].status_code == 503 and "kbp_ui_frozen" in first["resp"].json()["detail"], first[
            "resp"
        ].text
    finally:
        frozen.close()
