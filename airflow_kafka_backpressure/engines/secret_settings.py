"""Which of a pipeline's Spark settings may be shown, and how the others are kept hidden.

A pipeline's ``spark_conf`` carries whatever its job needs, credentials included, and their names
follow no rule Spark could rely on: ``spark.hadoop.fs.s3a.secret.key`` matches Spark's redaction
pattern (``spark.redaction.regex``, ``(?i)secret|password|token|access[.]?key`` by default), but
``fs.s3a.encryption.key``, ``fs.gs.auth.service.account.private.key``, an Azure SAS key or a JDBC URL
with a password in a catalog's settings do not. So every setting is treated as a secret **unless it
is known to hold none** (:data:`KNOWN_SAFE`: executor and driver sizing, SQL tuning, Delta, the
event log, dynamic allocation, the non-credential S3A connection settings …) and its name has no
secret-looking word (:data:`SECRET_WORDS`).

* The submit engine passes secret settings in a private properties file, never as ``--conf`` on the
  command line, and extends the application's ``spark.redaction.regex`` with their names, so the
  Spark UI, its REST API and the event log hide their values too (:func:`redaction_regex`).
* The connect engine refuses them: a Spark Connect session's settings reach its jobs as local
  properties, which the server's event log records without redaction (only settings of the server's
  own configuration are redacted there). They belong in the server's configuration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = [
    "KNOWN_SAFE",
    "REDACTION_KEY",
    "SECRET_WORDS",
    "SPARK_DEFAULT_REDACTION",
    "is_secret_setting",
    "redaction_regex",
    "split_secret_settings",
]

REDACTION_KEY = "spark.redaction.regex"
HADOOP_PREFIX = "spark.hadoop."
#: Spark's own default of ``spark.redaction.regex``.
SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"

#: Words that make any setting secret, whatever its family.
SECRET_WORDS = re.compile(
    r"(?i)secret|passw|token|credential|access[.]?key|private|signature|\bsas\b|sas[._-]?(key|token)"
    r"|encryption|account\.key|\.key$|auth"
)

_SAFE_FAMILIES = r"""
    (executor|driver)\.(memory|cores|instances|memoryOverhead|memoryOverheadFactor|maxResultSize
        |extraClassPath|extraLibraryPath|host|bindAddress|port|blockManager\.port)
  | executor\.heartbeatInterval
  | sql\.(shuffle\.partitions|adaptive\.[\w.]+|files\.[\w.]+|parquet\.[\w.]+|sources\.[\w.]+
        |session\.timeZone|extensions|catalog\.spark_catalog|autoBroadcastJoinThreshold|ansi\.enabled
        |execution\.arrow\.[\w.]+|execution\.pythonUDF\.[\w.]+|redaction\.[\w.]+|legacy\.[\w.]+
        |warehouse\.dir|codegen\.[\w.]+|optimizer\.[\w.]+|broadcastTimeout|debug\.maxToStringFields)
  | (default\.parallelism|serializer|local\.dir|cores\.max|task\.cpus|task\.maxFailures|network\.timeout
        |speculation|app\.name|master|submit\.deployMode|files|jars|submit\.pyFiles|archives
        |redaction\.regex|redaction\.string\.regex)
  | eventLog\.(enabled|dir|compress|compression\.codec|rolling\.[\w.]+|logStageExecutorMetrics)
  | ui\.(enabled|port|showConsoleProgress|retainedJobs|retainedStages|retainedTasks|killEnabled)
  | jars\.(packages|repositories|excludes|ivy|ivySettings)
  | pyspark\.(python|driver\.python)
  | (dynamicAllocation|scheduler|memory|kryoserializer|shuffle|storage|rdd|locality|python\.worker)\.[\w.]+
  | (databricks\.delta|delta)\.[\w.]+
  | hadoop\.fs\.s3a\.(endpoint|endpoint\.region|path\.style\.access|connection\.[\w.]+|impl|aws\.credentials\.provider
        |fast\.upload[\w.]*|committer\.[\w.]+|multipart\.[\w.]+|threads\.max|attempts\.maximum|retry\.[\w.]+
        |bucket\.probe|change\.detection\.[\w.]+|directory\.marker\.retention)
  | hadoop\.fs\.defaultFS
"""
#: Settings known to hold no secret (and the engine's own: ``spark.redaction.regex`` included).
KNOWN_SAFE = re.compile(r"^spark\.(" + _SAFE_FAMILIES + r")$", re.VERBOSE)


def is_secret_setting(key: str) -> bool:
    """True unless ``key`` is a setting known to hold no secret (see the module doc)."""
    return SECRET_WORDS.search(key) is not None or KNOWN_SAFE.match(key) is None


def split_secret_settings(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(known safe, secret)`` settings of ``conf``."""
    plain = {k: v for k, v in conf.items() if not is_secret_setting(k)}
    secret = {k: v for k, v in conf.items() if is_secret_setting(k)}
    return plain, secret


def redaction_regex(secret_keys: Iterable[str], current: str | None = None) -> str:
    """``spark.redaction.regex`` (``current``, else Spark's default) extended with ``secret_keys``
    (quoted literally), so Spark redacts those settings wherever it shows its configuration. A
    ``spark.hadoop.*`` setting is named without that prefix: Spark also shows it among the Hadoop
    properties, under the Hadoop name (the pattern is searched for, so it matches both)."""
    keys = sorted({k[len(HADOOP_PREFIX) :] if k.startswith(HADOOP_PREFIX) else k for k in secret_keys})
    base = current or SPARK_DEFAULT_REDACTION
    if not keys:
        return base
    return base + "|" + "|".join(r"\Q" + k + r"\E" for k in keys)
