"""A JSON Schema as the Spark type ``from_json`` parses into (Spark's JSON form of a ``DataType``,
``StructType.fromJson`` reads it), in pure Python.

What maps: ``object`` with ``properties`` → a struct (every field nullable: ``required`` is not
enforced, a missing field is null); ``object`` with only ``additionalProperties`` → a map of
strings to its type; ``array`` → an array of ``items``; ``string`` (``format`` ``date-time`` →
timestamp, ``date`` → date), ``integer`` → long, ``number`` → double, ``boolean``; a type list or
``anyOf``/``oneOf`` of one type and ``null`` → that type; ``enum``/``const`` → the type of their
values; local ``$ref`` (``#/definitions/…``, ``#/$defs/…``). Anything else (a union of two
types, a recursive ``$ref``, ``not``, ``if``) is a :class:`~.base.DecoderError` naming its path:
declare that part as a string, or change the schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import DecoderError

_PRIMITIVES = {"integer": "long", "number": "double", "boolean": "boolean", "string": "string"}
_FORMATS = {"date-time": "timestamp", "date": "date"}


def spark_type(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The struct type (Spark's JSON form) of a JSON Schema whose top level is an object."""
    out = _convert(schema, schema, "#", ())
    if not isinstance(out, dict) or out.get("type") != "struct":
        raise DecoderError("the JSON schema's top level must be an object with properties (a record)")
    return out


def _convert(node: Any, root: Mapping[str, Any], path: str, refs: tuple[str, ...]) -> Any:
    if node is True or node == {}:
        raise DecoderError(f"{path}: any JSON value is allowed here; give it a type (a string, say)")
    if not isinstance(node, Mapping):
        raise DecoderError(f"{path}: a schema must be an object, got {node!r}")
    if "$ref" in node:
        ref = str(node["$ref"])
        if ref in refs:
            raise DecoderError(f"{path}: {ref} refers to itself; Spark's types cannot be recursive")
        return _convert(_resolve(ref, root, path), root, ref, (*refs, ref))
    for key in ("not", "if", "allOf"):
        if key in node:
            raise DecoderError(f"{path}: {key!r} is not supported: declare this part as a string")
    options = node.get("anyOf") or node.get("oneOf")
    if options is not None:
        typed = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
        if len(typed) != 1:
            raise DecoderError(
                f"{path}: a union of {len(typed)} types cannot be one Spark column; declare it as a string"
            )
        return _convert(typed[0], root, f"{path}/anyOf", refs)
    kind = _kind(node, path)
    if kind == "object":
        properties = node.get("properties")
        if properties:
            return {
                "type": "struct",
                "fields": [
                    {
                        "name": name,
                        "type": _convert(sub, root, f"{path}/properties/{name}", refs),
                        "nullable": True,
                        "metadata": {},
                    }
                    for name, sub in properties.items()
                ],
            }
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) and extra:
            value = _convert(extra, root, f"{path}/additionalProperties", refs)
            return {"type": "map", "keyType": "string", "valueType": value, "valueContainsNull": True}
        raise DecoderError(f"{path}: an object without properties has no columns; list its properties")
    if kind == "array":
        if "items" not in node:
            raise DecoderError(f"{path}: an array needs 'items'")
        element = _convert(node["items"], root, f"{path}/items", refs)
        return {"type": "array", "elementType": element, "containsNull": True}
    if kind == "string":
        return _FORMATS.get(str(node.get("format")), "string")
    return _PRIMITIVES[kind]


def _kind(node: Mapping[str, Any], path: str) -> str:
    kind = node.get("type")
    if kind is None:
        values = node.get("enum") or ([node["const"]] if "const" in node else None)
        if values:
            kinds = {_value_kind(v) for v in values if v is not None}
            if len(kinds) == 1:
                return kinds.pop()
            raise DecoderError(f"{path}: enum values of several types cannot be one Spark column")
        if "properties" in node:
            return "object"
        if "items" in node:
            return "array"
        raise DecoderError(f"{path}: no 'type'; give one")
    if isinstance(kind, list):
        typed = [k for k in kind if k != "null"]
        if len(typed) != 1:
            raise DecoderError(
                f"{path}: the type {kind!r} has {len(typed)} non-null types; declare it as a string"
            )
        kind = typed[0]
    if kind not in (*_PRIMITIVES, "object", "array"):
        raise DecoderError(f"{path}: unknown type {kind!r}")
    return str(kind)


def _value_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, Mapping) else "array"


def _resolve(ref: str, root: Mapping[str, Any], path: str) -> Any:
    if not ref.startswith("#/"):
        raise DecoderError(f"{path}: only local references (#/…) are supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            raise DecoderError(f"{path}: {ref!r} does not exist in the schema")
        node = node[part]
    return node
