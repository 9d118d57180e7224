"""Spark SQL text for the job's column expressions: the record decoders' and the read counts'
(``sinks.completion``).

The decoders build their expressions as SQL text, and the job hands each projection to Spark as
one ``selectExpr`` (each aggregate as one ``expr``): Spark parses it once. Built as pyspark ``Column`` objects instead, every node is
a round trip to the driver's JVM on a classic session (each function, literal, cast and alias,
several with pyspark's call-site capture): measured here, building one Avro batch's decode cost
about 2,000 of them, 0.2-0.3 s per batch in a warm process, more than Spark then spends checking a
million records' headers.

Literals are written so that the parser reads them the same under any session setting
(``spark.sql.parser.escapedStringLiterals``, ANSI mode, double-quoted identifiers): text with a
quote, a backslash or a character outside printable ASCII becomes ``CAST(X'<utf-8 hex>' AS
STRING)``, a constant Spark folds. Pure: no pyspark import.
"""

from __future__ import annotations

from collections.abc import Iterable

#: a null of type string (a CASE without a match is one too)
NULL_STRING = "CAST(NULL AS STRING)"


def string(text: str) -> str:
    """``text`` as a SQL string literal."""
    if all(" " <= c <= "~" for c in text) and "'" not in text and "\\" not in text:
        return f"'{text}'"
    return f"CAST(X'{text.encode('utf-8').hex()}' AS STRING)"


def binary(data: bytes) -> str:
    """``data`` as a SQL binary literal."""
    return f"X'{data.hex()}'"


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (a column, or a field of a struct after a dot)."""
    return "`" + name.replace("`", "``") + "`"


def options_map(options: dict[str, str]) -> str:
    """A ``map(...)`` of string options, as ``from_avro`` and ``from_json`` take them."""
    return "map(" + ", ".join(f"{string(k)}, {string(v)}" for k, v in options.items()) + ")"


def any_of(conditions: Iterable[str]) -> str:
    """The boolean OR of ``conditions`` (``false`` when there are none)."""
    parts = [f"({c})" for c in conditions]
    return " OR ".join(parts) if parts else "false"
