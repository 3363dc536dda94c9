"""The JSON result document (schema ``hcomm-bench/1``) and a validator for it.

The schema ships as ``schema.json`` (JSON Schema draft 2020-12, a small
subset: type, const, enum, required, properties, additionalProperties,
items, minimum).  jsonschema is not a dependency of hcomm, so
:func:`validate` implements exactly that subset; a test checks the shipped
schema uses nothing else, so the two cannot drift apart silently.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

SCHEMA_ID = "hcomm-bench/1"
SUPPORTED_KEYWORDS = {"$schema", "$id", "title", "description", "type", "const", "enum", "required",
                      "properties", "additionalProperties", "items", "minimum"}

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def load_schema() -> Dict[str, Any]:
    with open(os.path.join(os.path.dirname(__file__), "schema.json")) as f:
        return json.load(f)


def _errors(value: Any, schema: Dict[str, Any], path: str, out: List[str]) -> None:
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[k](value) for k in kinds):
            out.append(f"{path}: expected {'/'.join(kinds)}, got {type(value).__name__}")
            return
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        out.append(f"{path}: {value} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{path}: missing required key {key!r}")
        for key, item in value.items():
            if key in props:
                _errors(item, props[key], f"{path}.{key}", out)
            elif schema.get("additionalProperties", True) is False:
                out.append(f"{path}: unexpected key {key!r}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _errors(item, schema["items"], f"{path}[{i}]", out)


def validate(document: Any, schema: Dict[str, Any] = None) -> List[str]:
    """All the ways ``document`` breaks the schema (empty when it is valid)."""
    out: List[str] = []
    _errors(document, schema or load_schema(), "$", out)
    return out


def keywords_used(schema: Any) -> set:
    """Every keyword the schema uses (property names under "properties" excluded)."""
    found = set()
    if isinstance(schema, dict):
        for key, sub in schema.items():
            found.add(key)
            if key == "properties":
                for prop in sub.values():
                    found |= keywords_used(prop)
            elif isinstance(sub, (dict, list)):
                found |= keywords_used(sub)
    elif isinstance(schema, list):
        for sub in schema:
            if isinstance(sub, dict):
                found |= keywords_used(sub)
    return found


def document(cfg, result, machine: Dict[str, Any], versions: Dict[str, Any], created: str,
             command: str) -> Dict[str, Any]:
    return {
        "schema": SCHEMA_ID, "created": created, "command": command, "warnings": list(result.warnings),
        "machine": machine, "versions": versions,
        "topology": {"nranks": len(result.ranks), "ranks": result.ranks, "hcomm": result.hcomm_topology},
        "config": {"op": cfg.op, "dtype": cfg.dtype, "redop": cfg.redop, "root": cfg.root,
                   "iters": cfg.iters, "warmup": cfg.warmup, "backends": list(cfg.backends),
                   "algo": cfg.algo, "device": cfg.device},
        "records": result.records,
    }
