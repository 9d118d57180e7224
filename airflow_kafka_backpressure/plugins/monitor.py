"""The monitoring page of the Kafka backpressure pipelines, inside the Airflow UI.

A FastAPI app (:mod:`.api`) mounted by the API server under :data:`URL_PREFIX`, shown by the UI as
an external view (menu *Browse → Kafka Backpressure*, route ``/plugin/kafka-backpressure``). Per
pipeline it shows the batches of the ledger (PID rate limit against the arrival rate, records against planned, bad records, processing
time / batch interval with the scaling thresholds, scheduling delay, executors, lag, status,
errors), the replayable batches, each partition's lag and retention risk (read from the broker),
and the controller Variables (``kbp.<pipeline>.settings`` / ``.controller_state`` /
``.executor_target``), read-only.

Modules: :mod:`.auth` (Airflow authentication and auth manager checks), :mod:`.views` (the data),
:mod:`.api` (the routes), :mod:`.page` (the HTML, a package data file ``templates/monitor.html``),
:mod:`.internals` (the one pinned Airflow internal).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from .api import app
from .auth import authenticated_user
from .views import LEDGER_CONN_ENV, batch_view

__all__ = [
    "LEDGER_CONN_ENV",
    "URL_PREFIX",
    "URL_ROUTE",
    "KafkaBackpressurePlugin",
    "app",
    "authenticated_user",
    "batch_view",
]

#: Where the API server mounts the app (must not start with /api/v2, /ui, /execution, /auth, /pluginsv2).
URL_PREFIX = "/kafka-backpressure"
#: The UI route of the external view: the page shows at ``/plugin/<URL_ROUTE>``.
URL_ROUTE = "kafka-backpressure"


def page_href() -> str:
    """Where the UI's iframe loads the page: :data:`URL_PREFIX` under the path of ``[api] base_url``
    (the API server mounts everything there when Airflow is served under a sub-path)."""
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    root = urlsplit(conf.get("api", "base_url", fallback="") or "/").path or "/"
    return root.rstrip("/") + URL_PREFIX + "/"


class KafkaBackpressurePlugin(AirflowPlugin):
    """Registered through the ``airflow.plugins`` entry point only (not in the provider info)."""

    name = "kafka_backpressure"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Kafka backpressure monitor"}]
    external_views = [
        {
            "name": "Kafka Backpressure",
            "href": page_href(),
            "url_route": URL_ROUTE,
            "category": "browse",
            "destination": "nav",
        }
    ]
