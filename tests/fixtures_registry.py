"""Schema Registry fixtures (:mod:`kbp_local.schema_registry`: Confluent's REST API served by the tests).

* ``schema_registry`` — one registry for the whole session on 127.0.0.1 and a free port, with basic
  auth (``schema_registry.auth``); tests keep apart by subject (their topic's name), like tests on
  the shared broker keep apart by topic.
* ``schema_registry_client`` — confluent-kafka's ``SchemaRegistryClient`` for it (what the
  tests' producers serialize with).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from kbp_local.schema_registry import SchemaRegistryServer


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistryServer]:
    with SchemaRegistryServer(auth=("kbp-registry", secrets.token_urlsafe(16))) as server:
        yield server


@pytest.fixture
def schema_registry_client(schema_registry: SchemaRegistryServer) -> Iterator[Any]:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient(schema_registry.client_config())
    try:
        yield client
    finally:
        client.close()
