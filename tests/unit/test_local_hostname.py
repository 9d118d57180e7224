"""kbp_local.hostname.from_env: the compose stack's ``[core] hostname_callable`` (docker/compose.yaml
names each Celery worker in KBP_HOSTNAME, since on the host's network they share the host's name)."""

import socket

from airflow.configuration import conf

from kbp_local.hostname import from_env


def test_the_worker_name_when_set(monkeypatch):
    monkeypatch.setenv("KBP_HOSTNAME", " airflow-worker-2 ")
    assert from_env() == "airflow-worker-2"


def test_the_machine_name_otherwise(monkeypatch):
    monkeypatch.delenv("KBP_HOSTNAME", raising=False)
    assert from_env() == socket.getfqdn()
    monkeypatch.setenv("KBP_HOSTNAME", "")
    assert from_env() == socket.getfqdn()


def test_airflow_resolves_it_from_its_setting(monkeypatch):
    """The setting's value in compose.yaml, as Airflow's task SDK imports it."""
    monkeypatch.setenv("AIRFLOW__CORE__HOSTNAME_CALLABLE", "kbp_local.hostname.from_env")
    monkeypatch.setenv("KBP_HOSTNAME", "airflow-worker-1")
    assert conf.getimport("core", "hostname_callable")() == "airflow-worker-1"
