"""SchemaRegistryHook: a ``schema_registry`` connection → confluent-kafka's ``SchemaRegistryClient``.

The connection (type ``schema_registry``, its form declared in
:data:`~airflow_kafka_backpressure.get_provider_info.SCHEMA_REGISTRY_CONNECTION`):

* **Host**: the registry's URL, ``https://registry.example.com:8081`` (several, comma-separated,
  are tried in turn); without a scheme, ``http://`` and the Port field. Credentials in the URL
  are refused: they would travel wherever the URL is shown;
* **Login** / **Password**: HTTP basic auth (Confluent Cloud: the API key and secret);
* extra ``ca_location``: the CA certificate(s), PEM, that signed the registry's TLS certificate
  (a file or directory on the worker; default: the system's); ``certificate_location`` and
  ``key_location`` for a client certificate; ``timeout_s`` per request (default 30).

The client is the maintained one of confluent-kafka (the ``schema-registry`` extra), not HTTP of
our own. The credentials reach only the client: :meth:`SchemaRegistryHook.schemas` hands the
record decoders a source of schemas, and the decoders hand the Spark job schema text, never the
URL's credentials or the password; no message of this module repeats them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook

from ..decoders.registry import ConfluentSchemas
from ..get_provider_info import SCHEMA_REGISTRY_CONNECTION, ui_field_behaviour

CONN_TYPE = SCHEMA_REGISTRY_CONNECTION["connection-type"]
DEFAULT_TIMEOUT_S = float(SCHEMA_REGISTRY_CONNECTION["conn-fields"]["timeout_s"]["schema"]["default"])


class SchemaRegistryError(ValueError):
    """The connection cannot be used as configured; the message names it and the fix."""


class SchemaRegistryHook(BaseHook):
    conn_name_attr = "schema_registry_conn_id"
    default_conn_name = "schema_registry_default"
    conn_type = CONN_TYPE
    hook_name = "Schema Registry (Confluent API)"

    def __init__(self, schema_registry_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.schema_registry_conn_id = schema_registry_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form (declared once, in :mod:`..get_provider_info`)."""
        return ui_field_behaviour(cls.conn_type)

    @property
    def where(self) -> str:
        return f"schema registry connection {self.schema_registry_conn_id!r}"

    def urls(self) -> list[str]:
        """The registry's URLs (no credentials in them: refused)."""
        conn = self.get_connection(self.schema_registry_conn_id)
        host = (conn.host or "").strip()
        if not host:
            raise SchemaRegistryError(
                f"{self.where} has no Host: set it to the registry's URL (https://…:8081)"
            )
        urls = []
        for part in host.split(","):
            url = part.strip().rstrip("/")
            if "://" not in url:
                url = f"http://{url}:{conn.port}" if conn.port else f"http://{url}"
            parsed = urlsplit(url)
            if parsed.username is not None or parsed.password is not None:
                raise SchemaRegistryError(
                    f"{self.where}: its URL holds credentials; put the user and password in the "
                    "connection's Login and Password fields instead"
                )
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise SchemaRegistryError(f"{self.where}: {url!r} is not an http(s) URL of a host")
            urls.append(url)
        return urls

    def client_config(self) -> dict[str, Any]:
        """The client's settings. They hold the password: pass them to the client only."""
        conn = self.get_connection(self.schema_registry_conn_id)
        extra = conn.extra_dejson or {}
        config: dict[str, Any] = {"url": ",".join(self.urls())}
        if conn.login:
            config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
        elif conn.password:
            raise SchemaRegistryError(f"{self.where} has a password but no login: set the user (or API key)")
        for field, key in (
            ("ca_location", "ssl.ca.location"),
            ("certificate_location", "ssl.certificate.location"),
            ("key_location", "ssl.key.location"),
        ):
            if extra.get(field):
                config[key] = str(extra[field])
        timeout = extra.get("timeout_s")
        config["timeout"] = float(DEFAULT_TIMEOUT_S if timeout in (None, "") else timeout)
        return config

    def get_conn(self) -> Any:
        """confluent-kafka's ``SchemaRegistryClient`` for the connection."""
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as e:
            raise SchemaRegistryError(
                f"{self.where}: the schema registry client is not installed ({e}); install "
                "airflow-provider-kafka-backpressure[schema-registry]"
            ) from None
        try:
            return SchemaRegistryClient(self.client_config())
        except (ValueError, TypeError, OSError) as e:  # bad settings, an unreadable CA file
            raise SchemaRegistryError(f"{self.where}: {type(e).__name__}: {e}") from None

    def schemas(self) -> ConfluentSchemas:
        """The record decoders' source of schemas (:meth:`~..decoders.base.RecordDecoder.prepare`)."""
        return ConfluentSchemas(self.get_conn(), self.where)

    def test_connection(self) -> tuple[bool, str]:
        """List the registry's subjects; the message names the connection, never its credentials."""
        try:
            client = self.get_conn()
            try:
                subjects = client.get_subjects()
            finally:
                client.close()
        except Exception as e:
            return False, _without_credentials(str(e), self)
        return True, f"{self.where}: connected to {', '.join(self.urls())}, {len(subjects)} subject(s)"


def _without_credentials(message: str, hook: SchemaRegistryHook) -> str:
    conn = hook.get_connection(hook.schema_registry_conn_id)
    if conn.password:
        message = message.replace(conn.password, "***")
    return f"{hook.where}: {message}" if hook.where not in message else message
