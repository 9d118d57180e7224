"""A Schema Registry for the tests, the demo and the benchmarks: Confluent's REST API, served from
a thread of the calling process (``python -m kbp_local.schema_registry`` serves one on its own).

**What stands in, and why.** The record decoders (``airflow_kafka_backpressure.decoders``) and the
producers of the tests talk to a Confluent Schema Registry. No real one can be installed here
(/work/shared/NOTES.md): Confluent's server jars are not on Maven Central, Karapace is not on PyPI,
and Apicurio's Maven artifact is a library of a Quarkus application, not a runnable server. So
this module serves the part of Confluent's REST API (v1, ``application/vnd.schemaregistry.v1+json``)
that the maintained clients use — confluent-kafka's ``SchemaRegistryClient`` (the product's
client), its ``AvroSerializer`` and ``JSONSerializer`` (the tests' producers, so the bytes on the
topics are the real wire format) — with Confluent's documented semantics and error shapes:

* ``POST /subjects/{subject}/versions`` registers a schema (``schemaType`` ``AVRO``, the default,
  or ``JSON``; ``references`` kept) and answers ``{"id": N}``. Ids are global and stable: the same
  schema (same type, same parsed text, same references) has one id in every subject, and
  registering a schema the subject already holds returns its version's id without a new version.
  An unparsable schema is ``422`` / ``42201``; a schema the subject's compatibility level refuses
  is ``409`` / ``409`` with the reasons in ``message``.
* ``GET /schemas/ids/{id}`` (``schema``, ``schemaType`` unless AVRO, ``references``),
  ``GET /schemas/ids/{id}/versions``, ``GET /schemas/ids/{id}/subjects``, ``GET /schemas/types``;
* ``GET /subjects``, ``GET /subjects/{subject}/versions``,
  ``GET /subjects/{subject}/versions/{version|latest}``, ``POST /subjects/{subject}`` (lookup),
  ``DELETE /subjects/{subject}`` and ``DELETE /subjects/{subject}/versions/{version}`` (soft:
  listed again with ``?deleted=true``; ids stay readable, as in Confluent's);
* ``GET``/``PUT /config`` and ``/config/{subject}`` (``compatibilityLevel``; default
  ``BACKWARD``), ``POST /compatibility/subjects/{subject}/versions/{version|latest}``.

Compatibility is Avro's schema resolution, checked by Apache Avro's own checker
(``avro.compatibility.ReaderWriterCompatibilityChecker``, the Python port of Java's
``SchemaCompatibility``) — the same rules as Confluent's ``AvroSchema.isBackwardCompatible``:
``BACKWARD`` (the new schema reads the latest), ``FORWARD`` (the latest reads the new one),
``FULL``, their ``_TRANSITIVE`` forms against every version, and ``NONE``. JSON schemas are not
checked (any change is accepted, as under ``NONE``): Confluent's JSON Schema rules are not modelled.

Not served: contexts, modes, metadata and rule sets, schema normalization, references' resolution
(kept as given), Protobuf. Everything is in memory, for the life of the server. Optional basic
auth (``401`` / ``40101`` without it, as Confluent's) and TLS (a certificate from
``kbp_local.tls``). ``requests`` records each request's method, path and
user, so a test can say what a client asked.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)


class RegistryError(Exception):
    """An error answer: HTTP status, Confluent's ``error_code`` and ``message``."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class _Schema:
    id: int
    schema_type: str
    text: str
    references: list[dict[str, Any]]
    identity: str  # what makes two registrations the same schema


@dataclass
class _Version:
    version: int
    schema_id: int
    deleted: bool = False


@dataclass
class _Subject:
    versions: list[_Version] = field(default_factory=list)
    compatibility: str | None = None

    def live(self, deleted: bool = False) -> list[_Version]:
        return [v for v in self.versions if deleted or not v.deleted]


def _identity(schema_type: str, text: str, references: list[dict[str, Any]]) -> str:
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = text
    return json.dumps([schema_type, parsed, references], sort_keys=True, separators=(",", ":"))


def avro_problems(reader_text: str, writer_text: str) -> list[str]:
    """Why data written with ``writer_text`` cannot be read with ``reader_text`` (Avro's schema
    resolution, by Apache Avro's checker); empty when it can."""
    import avro.schema
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    result = ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(reader_text), avro.schema.parse(writer_text)
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = sorted(str(k.value) for k in result.incompatibilities)
    return [
        f"{', '.join(kinds)} at {', '.join(sorted(result.locations))} ({', '.join(sorted(result.messages))})"
    ]


class Registry:
    """The registry's state and rules, without HTTP (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.schemas: dict[int, _Schema] = {}
        self.subjects: dict[str, _Subject] = {}
        self.compatibility = "BACKWARD"

    # ---------------------------------------------------------------- reads

    def schema(self, schema_id: int) -> _Schema:
        try:
            return self.schemas[schema_id]
        except KeyError:
            raise RegistryError(404, 40403, f"Schema {schema_id} not found") from None

    def subject(self, name: str) -> _Subject:
        subject = self.subjects.get(name)
        if subject is None or not subject.live():
            raise RegistryError(404, 40401, f"Subject '{name}' not found.")
        return subject

    def version(self, name: str, version: str, deleted: bool = False) -> _Version:
        subject = self.subject(name)
        live = subject.live(deleted)
        if version == "latest" or version == "-1":
            return live[-1]
        try:
            number = int(version)
        except ValueError:
            raise RegistryError(
                422,
                42202,
                f"The specified version '{version}' is not a valid version id. Allowed values are "
                'between [1, 2^31-1] and the string "latest"',
            ) from None
        for v in live:
            if v.version == number:
                return v
        raise RegistryError(404, 40402, f"Version {number} not found.")

    def level(self, name: str) -> str:
        subject = self.subjects.get(name)
        return (subject.compatibility if subject else None) or self.compatibility

    # ---------------------------------------------------------------- writes

    def register(self, name: str, body: dict[str, Any]) -> int:
        schema_type, text, references = self._parse(body)
        identity = _identity(schema_type, text, references)
        with self._lock:
            subject = self.subjects.setdefault(name, _Subject())
            for v in subject.live():
                if self.schemas[v.schema_id].identity == identity:
                    return v.schema_id
            problems = self._incompatibilities(subject, schema_type, text, self.level(name))
            if problems:
                raise RegistryError(
                    409,
                    409,
                    "Schema being registered is incompatible with an earlier schema for subject "
                    f'"{name}", details: {json.dumps(problems)}',
                )
            found = next((s for s in self.schemas.values() if s.identity == identity), None)
            if found is None:
                found = _Schema(len(self.schemas) + 1, schema_type, text, references, identity)
                self.schemas[found.id] = found
            number = max((v.version for v in subject.versions), default=0) + 1
            subject.versions.append(_Version(number, found.id))
            return found.id

    def lookup(self, name: str, body: dict[str, Any], deleted: bool = False) -> tuple[_Version, _Schema]:
        schema_type, text, references = self._parse(body)
        identity = _identity(schema_type, text, references)
        subject = self.subject(name)
        for v in subject.live(deleted):
            if self.schemas[v.schema_id].identity == identity:
                return v, self.schemas[v.schema_id]
        raise RegistryError(404, 40403, "Schema not found")

    def check(self, name: str, version: str, body: dict[str, Any]) -> list[str]:
        """Incompatibilities of ``body`` against one version (``POST /compatibility/...``)."""
        schema_type, text, _ = self._parse(body)
        against = self.version(name, version)
        return self._compare(schema_type, text, [against], self.level(name))

    def delete_subject(self, name: str) -> list[int]:
        with self._lock:
            subject = self.subject(name)
            gone = [v.version for v in subject.live()]
            for v in subject.versions:
                v.deleted = True
            return gone

    def delete_version(self, name: str, version: str) -> int:
        with self._lock:
            v = self.version(name, version)
            v.deleted = True
            return v.version

    def _parse(self, body: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
        schema_type = str(body.get("schemaType") or "AVRO").upper()
        text = body.get("schema")
        if not isinstance(text, str):
            raise RegistryError(422, 42201, "Invalid schema: the request has no 'schema' string")
        if schema_type not in ("AVRO", "JSON"):
            raise RegistryError(422, 42201, f"Invalid schema: unsupported schema type {schema_type}")
        try:
            if schema_type == "AVRO":
                import avro.schema

                avro.schema.parse(text)
            else:
                json.loads(text)
        except Exception as e:
            raise RegistryError(422, 42201, f"Invalid schema {text}, details: {e}") from None
        return schema_type, text, list(body.get("references") or [])

    def _incompatibilities(self, subject: _Subject, schema_type: str, text: str, level: str) -> list[str]:
        live = subject.live()
        if not live:
            return []
        against = live if level.endswith("_TRANSITIVE") else live[-1:]
        return self._compare(schema_type, text, against, level)

    def _compare(self, schema_type: str, text: str, against: list[_Version], level: str) -> list[str]:
        if level == "NONE" or schema_type != "AVRO":
            return []
        problems = []
        for v in against:
            old = self.schemas[v.schema_id]
            if old.schema_type != "AVRO":
                problems.append(f"version {v.version} is a {old.schema_type} schema, not AVRO")
                continue
            if level.startswith(("BACKWARD", "FULL")):
                problems += [
                    f"new schema cannot read version {v.version}: {p}" for p in avro_problems(text, old.text)
                ]
            if level.startswith(("FORWARD", "FULL")):
                problems += [
                    f"version {v.version} cannot read the new schema: {p}"
                    for p in avro_problems(old.text, text)
                ]
        return problems


def _schema_body(schema: _Schema) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": schema.text}
    if schema.schema_type != "AVRO":  # Confluent's registry leaves the default type out
        body["schemaType"] = schema.schema_type
    if schema.references:
        body["references"] = schema.references
    return body


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[0].lower() == "true"


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # quiet: pytest shows failures, not every request

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        owner = self.server.owner
        user = self._user()
        owner.requests.append((method, url.path, user))
        try:
            if owner.auth is not None and user != owner.auth[0]:
                raise RegistryError(401, 40101, "Unauthorized")
            body = json.loads(raw) if raw else {}
            status, answer = 200, _route(owner.registry, method, parts, query, body)
        except RegistryError as e:
            status, answer = e.status, {"error_code": e.code, "message": e.message}
        except ValueError as e:  # a body that is not JSON
            status, answer = 400, {"error_code": 400, "message": f"Unrecognized request body: {e}"}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="SchemaRegistry"')
        self.end_headers()
        self.wfile.write(data)

    def _user(self) -> str | None:
        """The basic-auth user whose password is right (None: no or wrong credentials)."""
        header = self.headers.get("Authorization") or ""
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None
        auth = self.server.owner.auth
        return user if auth is not None and (user, password) == auth else None


def _route(
    registry: Registry, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any]
) -> Any:
    deleted = _flag(query, "deleted")
    match method, parts:
        case "GET", ["schemas", "types"]:
            return ["JSON", "AVRO"]
        case "GET", ["schemas", "ids", sid]:
            return _schema_body(registry.schema(int(sid)))
        case "GET", ["schemas", "ids", sid, "versions"]:
            schema = registry.schema(int(sid))
            return [
                {"subject": name, "version": v.version}
                for name, s in registry.subjects.items()
                for v in s.live(deleted)
                if v.schema_id == schema.id
            ]
        case "GET", ["schemas", "ids", sid, "subjects"]:
            schema = registry.schema(int(sid))
            return sorted(
                {
                    name
                    for name, s in registry.subjects.items()
                    for v in s.live(deleted)
                    if v.schema_id == schema.id
                }
            )
        case "GET", ["subjects"]:
            return sorted(name for name, s in registry.subjects.items() if s.live(deleted))
        case "GET", ["subjects", name, "versions"]:
            return [v.version for v in registry.subject(name).live(deleted)]
        case "GET", ["subjects", name, "versions", version]:
            v = registry.version(name, version, deleted)
            return {
                "subject": name,
                "version": v.version,
                "id": v.schema_id,
                **_schema_body(registry.schema(v.schema_id)),
            }
        case "POST", ["subjects", name, "versions"]:
            return {"id": registry.register(name, body)}
        case "POST", ["subjects", name]:
            v, schema = registry.lookup(name, body, deleted)
            return {"subject": name, "version": v.version, "id": schema.id, **_schema_body(schema)}
        case "DELETE", ["subjects", name]:
            return registry.delete_subject(name)
        case "DELETE", ["subjects", name, "versions", version]:
            return registry.delete_version(name, version)
        case "GET", ["config"]:
            return {"compatibilityLevel": registry.compatibility}
        case "GET", ["config", name]:
            return {"compatibilityLevel": registry.level(name)}
        case "PUT", ["config", *rest] if len(rest) <= 1:
            level = str(body.get("compatibility", "")).upper()
            if level not in LEVELS:
                raise RegistryError(
                    422, 42203, f"Invalid compatibility level. Valid values are {', '.join(LEVELS)}"
                )
            if rest:
                registry.subjects.setdefault(rest[0], _Subject()).compatibility = level
            else:
                registry.compatibility = level
            return {"compatibility": level}
        case "POST", ["compatibility", "subjects", name, "versions", version]:
            problems = registry.check(name, version, body)
            answer: dict[str, Any] = {"is_compatible": not problems}
            if _flag(query, "verbose"):
                answer["messages"] = problems
            return answer
    raise RegistryError(404, 404, f"HTTP 404 Not Found: {method} /{'/'.join(parts)}")


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: SchemaRegistryServer


class SchemaRegistryServer:
    """The registry on ``127.0.0.1`` and a free port, in a thread: ``start()``, ``url``,
    ``stop()``. ``auth``: a (user, password) pair every request must send (basic auth);
    ``tls_dir``: serve HTTPS with a throw-away CA and certificate made there (``ca_path``)."""

    def __init__(
        self, *, auth: tuple[str, str] | None = None, tls_dir: Path | None = None, port: int = 0
    ) -> None:
        self.port = port
        self.auth = auth
        self.tls_dir = tls_dir
        self.ca_path: Path | None = None
        self.registry = Registry()
        self.requests: list[tuple[str, str, str | None]] = []
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the schema registry is not started")
        scheme = "https" if self.ca_path else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka ``SchemaRegistryClient`` settings that reach this registry."""
        conf: dict[str, Any] = {"url": self.url}
        if self.auth:
            conf["basic.auth.user.info"] = ":".join(self.auth)
        if self.ca_path:
            conf["ssl.ca.location"] = str(self.ca_path)
        return conf

    def start(self) -> SchemaRegistryServer:
        server = _HttpServer(("127.0.0.1", self.port), _Handler)
        server.owner = self
        if self.tls_dir is not None:
            from kbp_local.tls import make_server_tls

            tls = make_server_tls(self.tls_dir)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls.keystore_path)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            self.ca_path = tls.ca_path
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="schema-registry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> SchemaRegistryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(port: int = 0) -> int:
    """Serve a registry on 127.0.0.1:``port`` (0: a free one) until SIGTERM or Ctrl-C; prints
    ``listening <url>`` once it answers (``python -m kbp_local schema-registry``)."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with SchemaRegistryServer(port=port) as server:
        print(f"listening {server.url}", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    return 0
