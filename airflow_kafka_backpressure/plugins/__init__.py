"""Airflow UI plugins of the provider.

:mod:`.monitor` holds the monitoring page. It is registered only through the ``airflow.plugins``
entry point (pyproject.toml); listing it in the provider info as well would register it twice.
"""
