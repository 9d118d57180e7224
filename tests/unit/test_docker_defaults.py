"""The compose stack's defaults are safe to run on a shared machine (issue 21, item 7): its UIs are
published on the loopback interface only, and there is no well-known admin password."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _default(value: str) -> str:
    """``value`` with each ``${VAR:-default}`` replaced by its default, as compose does when VAR is unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_published_ports_bind_the_loopback_interface_by_default():
    services = yaml.safe_load((DOCKER / "compose.override.yaml").read_text())["services"]
    published = [(name, _default(p)) for name, svc in services.items() for p in svc.get("ports", [])]
    assert published, "compose.override.yaml publishes no port"
    for name, port in published:
        assert port.count(":") == 2 and port.split(":")[0] == "127.0.0.1", (name, port)


def test_no_service_has_a_default_admin_password():
    text = (DOCKER / "compose.yaml").read_text()
    defaults = re.findall(r"AIRFLOW_ADMIN_PASSWORD:-([^}]*)\}", text)
    assert defaults and all(d == "" for d in defaults), defaults
    users = yaml.safe_load(text)["x-airflow-env"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    assert users == "admin:admin"  # user admin with role admin: its password comes from the passwords file
    init = (DOCKER / "init.sh").read_text()
    assert "secrets.token_urlsafe" in init and 'os.environ.get("AIRFLOW_ADMIN_PASSWORD", "")' in init
