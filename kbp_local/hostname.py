"""Airflow's ``[core] hostname_callable`` for containers that share one host's network.

On the host's network (docker/compose.hostnet.yaml) every container has the host's name, so two
Celery workers would record the same ``hostname`` on their task instances, and the monitoring,
the logs and docker/test.sh could not tell them apart. The compose file names each worker in
``KBP_HOSTNAME`` and points ``AIRFLOW__CORE__HOSTNAME_CALLABLE`` here:

    AIRFLOW__CORE__HOSTNAME_CALLABLE=kbp_local.hostname.from_env

Without ``KBP_HOSTNAME`` it is Airflow's default (the fully qualified domain name).
"""

from __future__ import annotations

import os
import socket


def from_env() -> str:
    """``KBP_HOSTNAME``, else the machine's fully qualified domain name."""
    return os.environ.get("KBP_HOSTNAME", "").strip() or socket.getfqdn()
