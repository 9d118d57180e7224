"""Process environment and Spark configuration the bounded job needs, so users do not have to.

Two plain ``dict[str, str]`` builders, meant for the Spark provider's ``SparkSubmitHook``
(``env_vars=`` and ``conf=``) or a ``SparkSession.builder``:

* :func:`spark_submit_env` — ``SPARK_HOME`` of the installed ``pyspark`` (the pip package's
  ``spark-submit`` cannot find it on its own), the Python interpreter for driver and workers, the
  interpreter's ``bin`` first on ``PATH`` (that is where ``spark-submit`` lives), loopback binding and
  Spark's scratch directories inside ``work_dir``.
* :func:`spark_conf_defaults` — driver host/bind address on loopback, ``java.io.tmpdir`` inside
  ``work_dir``, no console progress bars, no web UI (a bounded job
  per interval; several at once would fight over port 4040+; enable it with
  ``spark.ui.enabled=true``) and WARN logging.

Whatever the user set wins: a key already present in ``user_env`` (or the current process
environment) or in ``user_conf`` is left as the user set it. A user's ``extraJavaOptions`` keep
their content; only a missing ``-Djava.io.tmpdir`` is appended.

``local_only=True`` (the default) means the driver and every executor run on this machine
(``local[N]`` or a standalone cluster bound to 127.0.0.1). With executors on other hosts (YARN,
Kubernetes, a remote standalone master) pass ``local_only=False``: loopback binding and the
executor temp directory would then break the job, so they are not set.

Directories named here are created, because the JVM does not create ``java.io.tmpdir`` itself.
No Spark, Kafka or Airflow imports. Runs where a batch is launched (the Airflow worker), never inside Spark.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

LOOPBACK = "127.0.0.1"


def work_root() -> Path:
    """This Airflow worker's local directory for the package zip and per-attempt scratch
    directories (under ``$AIRFLOW_HOME``)."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.join(os.path.expanduser("~"), "airflow")
    return Path(home) / "kafka_backpressure"


def pyspark_home() -> str:
    """The installed ``pyspark`` package directory, which is a complete ``SPARK_HOME``."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "pyspark is not installed in this interpreter "
            f"({sys.executable}); install the provider with its pinned pyspark"
        )
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


def scripts_dir() -> str:
    """Where this interpreter's console scripts (``spark-submit``) are installed."""
    path = sysconfig.get_path("scripts")
    if path and Path(path, "spark-submit").exists():
        return path
    return str(Path(sys.executable).parent)


def work_dirs(work_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """The scratch directories inside ``work_dir`` (created)."""
    root = Path(work_dir).resolve()
    dirs = {"local": root / "spark-local", "tmp": root / "java-tmp"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def spark_submit_env(
    work_dir: str | os.PathLike[str],
    user_env: Mapping[str, str] | None = None,
    *,
    local_only: bool = True,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment variables for ``spark-submit``: ``user_env`` plus the defaults it lacks.

    ``environ`` (default: ``os.environ``) is the environment spark-submit inherits; a variable set
    there is not overridden either, except ``PATH``, which gets the interpreter's ``bin`` in front.
    """
    user = dict(user_env or {})
    inherited = os.environ if environ is None else environ
    dirs = work_dirs(work_dir)
    python = sys.executable
    defaults = {
        "SPARK_HOME": pyspark_home(),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        "SPARK_LOCAL_DIRS": str(dirs["local"]),
    }
    if local_only:
        defaults["SPARK_LOCAL_IP"] = LOOPBACK
    out = dict(user)
    for key, value in defaults.items():
        if key not in user and key not in inherited:
            out[key] = value
    if "PATH" not in user:
        bin_dir = scripts_dir()
        path = inherited.get("PATH", "")
        parts = [p for p in path.split(os.pathsep) if p]
        if not parts or parts[0] != bin_dir:
            out["PATH"] = os.pathsep.join([bin_dir, *[p for p in parts if p != bin_dir]])
        else:
            out["PATH"] = path
    return out


def _with_tmpdir(java_options: str | None, tmpdir: Path) -> str:
    opts = (java_options or "").strip()
    if "-Djava.io.tmpdir=" in opts:
        return opts
    return f"{opts} -Djava.io.tmpdir={tmpdir}".strip()


def spark_conf_defaults(
    work_dir: str | os.PathLike[str],
    user_conf: Mapping[str, str] | None = None,
    *,
    local_only: bool = True,
) -> dict[str, str]:
    """Spark configuration for the job: ``user_conf`` plus the defaults it lacks."""
    user = {k: str(v) for k, v in (user_conf or {}).items()}
    tmp = work_dirs(work_dir)["tmp"]
    defaults = {
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.log.level": "WARN",
    }
    if local_only:
        defaults["spark.driver.host"] = LOOPBACK
        defaults["spark.driver.bindAddress"] = LOOPBACK
    out = dict(user)
    for key, value in defaults.items():
        out.setdefault(key, value)
    java_keys = ["spark.driver.extraJavaOptions"]
    if local_only:
        java_keys.append("spark.executor.extraJavaOptions")
    for key in java_keys:
        out[key] = _with_tmpdir(user.get(key), tmp)
    return out


def spark_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of the ``spark-defaults.conf`` that spark-submit would read
    (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else the installed pyspark's ``conf``).

    ``spark-submit --properties-file`` reads that file *instead* of ``spark-defaults.conf``, so a
    properties file written for secrets starts with these: a cluster's defaults still apply.
    Java properties syntax: ``key value`` or ``key=value`` (or ``:``), ``#``/``!`` comments."""
    env = os.environ if environ is None else environ
    conf_dir = env.get("SPARK_CONF_DIR") or os.path.join(env.get("SPARK_HOME") or pyspark_home(), "conf")
    path = Path(conf_dir) / "spark-defaults.conf"
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":"), _first_space(line)) if i >= 0), default=-1)
        if cut < 0:
            out[line] = ""
        else:
            out[line[:cut].strip()] = line[cut + 1 :].strip().lstrip("=:").strip()
    return out


def _first_space(line: str) -> int:
    return next((i for i, c in enumerate(line) if c in " \t"), -1)
