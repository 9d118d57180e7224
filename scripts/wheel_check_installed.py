"""The checks of scripts/wheel_check.sh inside the clean venv, on the installed wheel.

Run by the venv's interpreter from a copy outside the checkout, with AIRFLOW_HOME in the temp dir;
reads the JSON the Airflow CLI wrote into $KBP_WC_LOGS. Prints one line per check; every check runs,
and the exit status is 1 when any failed.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

LOGS = Path(os.environ["KBP_WC_LOGS"])
VENV = Path(os.environ["KBP_WC_VENV"]).resolve()
CHECKOUT = Path(os.environ["KBP_WC_CHECKOUT"]).resolve()
DIST = "airflow-provider-kafka-backpressure"
PKG = "airflow_kafka_backpressure"
PLUGIN_MODULE = f"{PKG}.plugins.monitor"

failures: list[str] = []


class CheckFailed(Exception):
    pass


def check(what: str, fn: Callable[[], str]) -> None:
    """Run one check: ``fn`` returns the ok line's detail or raises CheckFailed (or anything)."""
    try:
        detail = fn()
    except CheckFailed as e:
        failures.append(f"{what}: {e}")
        print(f"wheel_check: FAIL {what}: {e}", file=sys.stderr, flush=True)
    except Exception as e:  # an import or a load that broke: name it
        failures.append(f"{what}: {type(e).__name__}: {e}")
        print(f"wheel_check: FAIL {what}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    else:
        print(f"wheel_check: ok   {what}: {detail}", flush=True)


def cli_json(name: str) -> Any:
    text = (LOGS / name).read_text()
    starts = [i for i in (text.find("["), text.find("{")) if i >= 0]  # past any warnings
    if not starts:
        raise CheckFailed(f"no JSON in the CLI's output ({name}): {text[:300]!r}")
    try:
        return json.JSONDecoder().raw_decode(text[min(starts) :])[0]
    except ValueError as e:
        raise CheckFailed(f"no JSON in the CLI's output ({name}): {e}: {text[:300]!r}") from e


def from_venv(module_name: str) -> Any:
    """Import a module and check that it comes from the venv's site-packages, not the checkout."""
    module = importlib.import_module(module_name)
    path = Path(module.__file__).resolve()
    if not path.is_relative_to(VENV) or path.is_relative_to(CHECKOUT):
        raise CheckFailed(f"{module_name} imported from {path}, not from the venv's site-packages")
    return module


def provider() -> str:
    info = cli_json("provider.json")
    text = json.dumps(info)
    version = distribution(DIST).version
    if DIST not in text or version not in text:
        raise CheckFailed(f"{DIST} {version} not in `airflow providers get`: {text[:300]}")
    return f"{DIST} {version}"


def connection_types() -> str:
    try:
        distribution("apache-airflow-providers-apache-kafka")
        official = True
    except PackageNotFoundError:
        official = False
    info = from_venv(f"{PKG}.get_provider_info").get_provider_info()
    declared = {c["connection-type"]: c["hook-class-name"] for c in info["connection-types"]}
    expected = {"kbp_ledger", "schema_registry"} | (set() if official else {"kafka"})
    if set(declared) != expected:
        raise CheckFailed(
            f"get_provider_info declares {sorted(declared)}, expected {sorted(expected)} "
            f"(official Kafka provider installed: {official})"
        )
    by_type = {h.get("connection_type"): h for h in cli_json("hooks.json")}
    shown = []
    for conn_type, hook_class in sorted(declared.items()):
        hook = by_type.get(conn_type)
        if hook is None:
            raise CheckFailed(
                f"connection type {conn_type!r} missing (listed: {sorted(t for t in by_type if t)})"
            )
        if hook.get("class") != hook_class or hook.get("package_name") != DIST:
            raise CheckFailed(f"{conn_type!r} is {hook}, expected {hook_class} from {DIST}")
        shown.append(f"{conn_type} -> {hook_class}")
    return "; ".join(shown)


def plugin_listed() -> str:
    plugins = (
        cli_json("plugins.json") if "No plugins loaded" not in (LOGS / "plugins.json").read_text() else []
    )
    mine = [p for p in plugins if "KafkaBackpressure" in json.dumps(p) or DIST in json.dumps(p)]
    if not mine:
        from airflow import plugins_manager

        plugins_manager.ensure_plugins_loaded()
        errors = {k: v for k, v in plugins_manager.get_import_errors().items() if PKG in k}
        raise CheckFailed(
            f"the plugin is not listed (listed: {[p.get('name') for p in plugins]}); "
            f"Airflow's import errors for it: {errors or 'none'}"
        )
    return f"{mine[0].get('name')} from {mine[0].get('source')}"


def plugin_imports() -> str:
    monitor = from_venv(PLUGIN_MODULE)
    return f"{PLUGIN_MODULE}:KafkaBackpressurePlugin (name {monitor.KafkaBackpressurePlugin.name!r}) from the venv"


def template() -> str:
    page = from_venv(f"{PKG}.plugins.page")
    html = page.template()
    if "__NONCE__" not in html or "__BOOT__" not in html:
        raise CheckFailed(f"templates/{page.TEMPLATE} loads but lacks its __NONCE__ and __BOOT__ slots")
    return f"plugins/templates/{page.TEMPLATE} loads ({len(html)} characters)"


def no_tooling() -> str:
    """The demo's and the tests' servers (``kbp_local``, beside the package in the repository) are
    not in the wheel, and nothing of the package is named ``local`` any more."""
    import importlib.util

    found = [name for name in ("kbp_local", f"{PKG}.local") if importlib.util.find_spec(name) is not None]
    if found:
        raise CheckFailed(f"the wheel ships the local tooling: {', '.join(found)} import from the venv")
    return "kbp_local (the demo's and tests' servers) is not in the wheel"


def migrations() -> str:
    migrate = from_venv(f"{PKG}.ledger.migrate")
    return f"ledger migrations load: head revision {migrate.head_revision()}"


def dag_factory() -> str:
    factory = from_venv(f"{PKG}.dag_factory")
    config = factory.PipelineConfig(name="wheelcheck", topics=("t",), sink=str(LOGS / "sink"))
    return f"{PKG}.dag_factory from the venv builds {sorted(factory.build_dags([config]))}"


def main() -> int:
    if any(Path(p or ".").resolve() == CHECKOUT for p in sys.path):
        print(f"wheel_check: FAIL the checkout {CHECKOUT} is on sys.path", file=sys.stderr)
        return 1
    check("airflow providers get", provider)
    check("airflow providers hooks: connection types", connection_types)
    check("airflow plugins", plugin_listed)
    check("plugin import", plugin_imports)
    check("package data", template)
    check("no tooling", no_tooling)
    check("package data", migrations)
    check("DAG factory", dag_factory)
    if failures:
        print(f"wheel_check: FAIL {len(failures)} check(s) of the installed wheel:", file=sys.stderr)
        for f in failures:
            print(f"wheel_check:      {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
