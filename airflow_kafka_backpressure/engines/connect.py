"""The connect engine: one batch through a Spark Connect client session to a long-lived server.

The server pays JVM, session and Python-worker start-up once; a batch pays a client session
(about a second), the upload of this package (and of the transform's package) as session artifacts,
and its own work; the batch's bounds check (:mod:`..spark.bounds`) runs while the session opens.
The batch logic is the submit engine's (:func:`~..spark.job.run_batch`): the Data Source, the
transform's UDFs and Spark's Parquet writer run on the server's executors and the sink's commit on
its driver side, the Python code imported from the artifacts. The client itself never touches the
sink's filesystem.

Every operation of the batch carries a tag unique to the attempt; stopping the batch (timeout,
``on_kill``, the task's supervisor gone) interrupts the operations with that tag on the server.

Sessions are reused: every batch of a pipeline with the same code (this package's and the
transform's artifacts, by content) opens its client session under one server-side session id,
kept in ``<work_root>/connect-sessions.json``, and closes only its connection at the end. The
server then keeps the session's artifacts and — what matters — the Python worker processes of the
session's environment (the Data Source planner, readers, writer, committer), which a new session
would start again for every batch. A session the server has closed (idle timeout,
``spark.connect.session.manager.defaultSessionTimeout``, 60 min by default; a restart) is replaced
by a new one. A ``session_id`` given in the connection's URL is used as it is.

Executors: a Connect server's executors belong to the server (its master and dynamic allocation
decide them). The executor target sets the batch's read parallelism instead —
``executors × executor_cores`` input partitions at least (large ranges are split) — so that with
dynamic allocation on the server the pending tasks become executors. The metrics record the
executors that really ran the batch's tasks.

Spark settings of the pipeline are applied to the session where Spark allows it at runtime (SQL
settings); static ones must be set on the server, and a warning names them. A setting not known to
hold no secret (:mod:`.secret_settings`) is refused: a session's settings reach its jobs as local
properties, which the server's event log records unredacted; it belongs in the server's configuration.

Credentials: no Kafka credential goes into a plan. The batch's secret Kafka properties travel as a
file of the server session (:mod:`..spark.session_secrets`), written for the attempt with owner-only
permissions, sent by the artifact protocol and deleted here once sent. A kept session holds the file
it was first given: when the credentials change, the server refuses the new one
(``ARTIFACT_ALREADY_EXISTS``) and the batch opens a new session.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_kafka_backpressure.batch.models import BatchMetrics, JobSpec

from ..spark.bounds import started_check
from ..spark.job import JobError, run_batch
from ..spark.session_secrets import write_secrets_file
from . import BatchJobError, Engine
from .environment import work_root
from .secret_settings import split_secret_settings
from .submit import package_zip, zip_tree

log = logging.getLogger(__name__)

#: Environment variables pyspark sets in the client process when a Connect session is created and
#: never removes. Left behind they put the whole process in Connect mode: a later ``spark-submit``
#: from it (the submit engine, the Spark provider's operators) inherits them and its driver then
#: fails with ``CONNECT_URL_NOT_SET``. The engine restores them when the batch ends.
CONNECT_ENV_VARS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


@contextlib.contextmanager
def restored_environment(names: tuple[str, ...] = CONNECT_ENV_VARS) -> Iterator[None]:
    """Put the variables ``names`` back as they were before the block (set, changed or removed)."""
    saved = {n: os.environ.get(n) for n in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def transform_package(transform: str | None, dest: Path) -> str | None:
    """A zip of the top-level package (or the single module) of ``transform`` for the server, or
    None when it is not importable here as files (then the server must already have it)."""
    if not transform:
        return None
    module = transform.partition(":")[0]
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    if spec.submodule_search_locations:  # a package: ship all of it
        root = Path(next(iter(spec.submodule_search_locations)))
        return zip_tree(root, top, dest, f"transform-{top}.zip")
    return str(Path(spec.origin))


def content_key(*parts: str, files: tuple[str, ...] = ()) -> str:
    """A short digest of ``parts`` and the contents of ``files``."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    for f in files:
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:32]


class SessionIds:
    """Server-side Spark Connect session ids by key, in a small JSON file (one per worker host)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> str:
        """The session id kept for ``key``; a new one (kept) when there is none."""
        sid = self._load().get(key)
        return sid if isinstance(sid, str) and sid else self.renew(key)

    def renew(self, key: str) -> str:
        """A new session id for ``key`` (the old one's session is gone)."""
        sid = str(uuid.uuid4())
        data = self._load()
        data[key] = sid
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, self.path)  # concurrent writers: the last one wins, each file is whole
        return sid


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port[/][;params]``) with the parameter ``session_id``."""
    head, sep, params = url.partition(";")
    head = head if head.endswith("/") else head + "/"
    return f"{head};{params};session_id={session_id}" if sep and params else f"{head};session_id={session_id}"


def session_closed(e: BaseException) -> bool:
    """True for the server's answer to a session id whose session it closed."""
    text = str(e)
    return "SESSION_CLOSED" in text or "SESSION_NOT_FOUND" in text


class ConnectEngine(Engine):
    """One batch through a Spark Connect session to ``url`` (``sc://host:port/;params``)."""

    name = "connect"

    def __init__(
        self,
        url: str,
        *,
        work_root: Path,
        spark_conf: Mapping[str, str] | None = None,
        conn_id: str = "spark_connect_default",
    ) -> None:
        super().__init__()
        self.url = url
        self.conn_id = conn_id
        self.work_root = Path(work_root)
        self.spark_conf = dict(spark_conf or {})
        self._session: Any = None
        self._tag: str | None = None

    def run(self, spec: JobSpec) -> BatchMetrics:
        with restored_environment():
            return self._run(spec)

    def _run(self, spec: JobSpec) -> BatchMetrics:
        plan = spec.plan
        _, secret = split_secret_settings(self.spark_conf)
        if secret:
            raise BatchJobError(
                plan.batch_id,
                f"the pipeline's spark_conf sets {', '.join(sorted(secret))}, which the connect engine does not set "
                "per session: they are not known to hold no secret, and a Spark Connect session's settings reach "
                "its jobs as local properties, which the server's event log records unredacted. Set them in the "
                "Connect server's own configuration (--conf or spark-defaults.conf when it starts; Spark redacts "
                "those) and remove them from spark_conf",
            )
        tag = f"kbp-{plan.pipeline}-batch-{plan.batch_id}-{spec.token}"
        problem = server_unreachable(self.url)
        if problem is not None:  # pyspark would retry for minutes before it says so
            raise BatchJobError(plan.batch_id, self._unreachable(problem))
        # the ranges are checked against the brokers while the client session opens (a replay that
        # may adopt its committed version checks after the adoption, in run_batch)
        bounds = started_check(spec) if spec.adopt is None else None
        artifacts = [package_zip(self.work_root / "dist")]
        extra = transform_package(spec.transform, self.work_root / "dist")
        if extra:
            artifacts.append(extra)
        private = self.work_root / "work" / f"{plan.pipeline}-batch-{plan.batch_id}-{spec.token}"
        try:
            secrets = write_secrets_file(spec.kafka, private)
            spark = self._open_session(spec, tag, artifacts, secrets)
        finally:
            shutil.rmtree(private, ignore_errors=True)  # sent (or not needed): the server keeps its copy
        if secrets is not None:
            spec = replace(spec, secrets_file=secrets.name)
        try:
            if self.stop_reason is not None:
                raise self.stopped_error(spec)  # type: ignore[misc]
            self._apply_conf(spark)
            log.info("Running batch %s on the Spark Connect server %s", plan.batch_id, _redacted(self.url))
            try:
                return run_batch(spark, spec, bounds=bounds)
            except Exception as e:
                stopped = self.stopped_error(spec)
                if stopped is not None:
                    raise stopped from e
                if isinstance(e, JobError):
                    raise BatchJobError(plan.batch_id, str(e)) from e
                raise BatchJobError(plan.batch_id, f"{type(e).__name__}: {_first_line(e)}") from e
        finally:
            self._session = None
            _close(spark)

    def _open_session(self, spec: JobSpec, tag: str, artifacts: list[str], secrets: Path | None) -> Any:
        """A client session with the batch's tag and artifacts (the code, and the file of the batch's
        Kafka credentials): the pipeline's kept server-side session, or a new one when the server
        closed it."""
        from pyspark.sql import SparkSession

        plan = spec.plan
        ids = SessionIds(self.work_root / "connect-sessions.json")
        fixed = "session_id=" in self.url
        key = content_key(_redacted(self.url), plan.pipeline, files=tuple(artifacts))
        for attempt in (1, 2):
            url = (
                self.url
                if fixed
                else with_session_id(self.url, ids.get(key) if attempt == 1 else ids.renew(key))
            )
            try:
                spark = SparkSession.builder.remote(url).create()
            except Exception as e:  # noqa: BLE001 - any client failure means "cannot reach the server"
                raise BatchJobError(
                    plan.batch_id, self._unreachable(f"{type(e).__name__}: {_first_line(e)}")
                ) from e
            self._session, self._tag = spark, tag
            try:
                spark.addTag(tag)  # tags are per thread: this one runs every operation of the batch
                spark.addArtifacts(*artifacts, pyfile=True)  # the first call to the server
                if secrets is not None:
                    spark.addArtifacts(str(secrets), file=True)  # before any plan of the batch
                return spark
            except Exception as e:
                self._session = None
                # a kept session holding credentials that changed is ended, with its copy of them
                stale_credentials = "ARTIFACT_ALREADY_EXISTS" in str(e)
                _close(spark, release=stale_credentials)
                if attempt == 1 and not fixed and session_closed(e):
                    log.info("The kept Spark Connect session is closed on the server; opening a new one")
                    continue
                if attempt == 1 and not fixed and stale_credentials:
                    log.info(
                        "The Kafka credentials changed since the kept Spark Connect session began; opening a new one"
                    )
                    continue
                if "UNAVAILABLE" in str(e) or "Connection refused" in str(e):  # gRPC: nobody answers
                    raise BatchJobError(
                        plan.batch_id, self._unreachable(f"{type(e).__name__}: {_first_line(e)}")
                    ) from e
                raise BatchJobError(
                    plan.batch_id,
                    f"the Spark Connect server at {_redacted(self.url)} refused the batch's session or its "
                    f"code (artifacts): {type(e).__name__}: {_first_line(e)}",
                ) from e
        raise AssertionError("unreachable")  # pragma: no cover

    def _unreachable(self, problem: str) -> str:
        return (
            f"cannot open a Spark Connect session at {_redacted(self.url)}: {problem}. Is the Connect server "
            f"running and reachable (the connection {self.conn_id!r})? python -m kbp_local spark-connect "
            "starts one on this machine"
        )

    def _apply_conf(self, spark: Any) -> None:
        for key, value in self.spark_conf.items():
            try:
                spark.conf.set(key, value)
            except Exception:  # noqa: BLE001 - static settings belong to the server
                log.warning(
                    "Spark setting %r cannot be set per session over Spark Connect; set it on the server", key
                )

    def _stop(self) -> None:
        session, tag = self._session, self._tag
        if session is not None and tag is not None:
            try:
                session.interruptTag(tag)
            except Exception as e:  # noqa: BLE001
                log.warning("could not interrupt the batch's operations (tag %s): %s", tag, _first_line(e))


CONNECT_PROBE_TIMEOUT_S = 10.0
DEFAULT_CONNECT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)


def server_unreachable(url: str, timeout_s: float = CONNECT_PROBE_TIMEOUT_S) -> str | None:
    """Why nothing accepts a TCP connection at ``url``'s host and port (``sc://host[:port]/...``),
    within ``timeout_s``; None when something does. pyspark's client retries an unreachable server
    with backoff for minutes before it fails; this answers in at most ``timeout_s``."""
    from urllib.parse import urlparse

    parsed = urlparse(url.partition(";")[0].replace("sc://", "http://", 1))
    host, port = parsed.hostname or "localhost", parsed.port or DEFAULT_CONNECT_PORT
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"no answer at {host}:{port} ({type(e).__name__}: {e})"


def _close(spark: Any, *, release: bool = False) -> None:
    """Close the client's connection, keeping the server-side session (and its Python workers)
    for the pipeline's next batch (``release``: end the server-side session too)."""
    try:
        spark.release_session_on_close = release  # pyspark's switch: False, stop() only disconnects
        spark.stop()
    except Exception as e:  # noqa: BLE001
        log.warning("could not close the Spark Connect client: %s", _first_line(e))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _redacted(url: str) -> str:
    """The Connect URL without its token parameter."""
    head, _, params = url.partition(";")
    kept = [p for p in params.split(";") if p and not p.lower().startswith("token=")]
    return head + (";" + ";".join(kept) if kept else "")


def from_hook(hook: Any, executors: int) -> ConnectEngine:
    """The engine of an attempt for :class:`~airflow_kafka_backpressure.hooks.spark_batch.SparkBatchHook`
    (its ``spark_connect`` connection; the server's executors are its own, ``executors`` is unused)."""

    return ConnectEngine(
        hook.connect_url(),
        work_root=work_root(),
        spark_conf=hook.spark_conf,
        conn_id=hook.spark_connect_conn_id,
    )
