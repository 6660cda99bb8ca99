"""Structured output, the shared mechanism (pure): the schema a caller asked for, its strict
form, a provider's refusal of it, and the check of a reply.

Nothing here reorders a schema: the schema lists the fields in the order the
prompt does, and llama.cpp writes them in that order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import orjson

# Outcomes recorded in the call log's `structured_output`
SENT = "sent"
DROPPED_AFTER_REJECTION = "dropped_after_rejection"
SKIPPED_KNOWN_REJECTION = "skipped_known_rejection"

# A 400 that says the schema (or structured output) is what the upstream refused.
SCHEMA_REJECTION_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"response_format", re.IGNORECASE),
    re.compile(r"json_schema", re.IGNORECASE),
    re.compile(r"output_config|output_format", re.IGNORECASE),
    re.compile(r"responseJsonSchema|responseSchema|response_schema", re.IGNORECASE),
    re.compile(r"\bschema\b", re.IGNORECASE),
    re.compile(r"structured output", re.IGNORECASE),
    re.compile(r"grammar", re.IGNORECASE),
)

_COMBINATORS = ("anyOf", "oneOf", "allOf")
_DEFINITIONS = ("$defs", "definitions")


@dataclass(frozen=True, slots=True)
class RequestedSchema:
    """The JSON schema a caller sent as OpenAI's ``response_format``."""

    name: str
    schema: dict[str, Any]


def requested_schema(body: dict[str, Any]) -> RequestedSchema | None:
    """The schema of ``response_format: {type: json_schema, ...}``, if the body has one."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema")
    # llama.cpp's README shows the schema at the top level; accept both
    schema = spec.get("schema") if isinstance(spec, dict) else fmt.get("schema")
    if not isinstance(schema, dict):
        return None
    name = spec.get("name") if isinstance(spec, dict) else None
    return RequestedSchema(name if isinstance(name, str) and name else "response", schema)


def _nullable(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]} if kind != "null" else schema
    if isinstance(kind, list):
        return schema if "null" in kind else {**schema, "type": [*kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


ObjectRule = Callable[[dict[str, Any], dict[str, Any]], None]


def _rebuild(schema: Any, rule: ObjectRule) -> Any:
    """The schema rebuilt key by key in order; ``rule(out, original)`` finishes every object
    that lists its properties, after its subschemas were rebuilt."""
    if isinstance(schema, list):
        return [_rebuild(s, rule) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebuild(v, rule) if k in ("items", *_COMBINATORS) else v for k, v in schema.items()}
    for key in _DEFINITIONS:
        if isinstance(schema.get(key), dict):
            out[key] = {n: _rebuild(s, rule) for n, s in schema[key].items()}
    props = schema.get("properties")
    if isinstance(props, dict):
        out["properties"] = {n: _rebuild(s, rule) for n, s in props.items()}
        rule(out, schema)
    return out


def _strict_object(out: dict[str, Any], original: dict[str, Any]) -> None:
    required = original.get("required")
    was = set(required) if isinstance(required, list) else set()
    out["properties"] = {
        name: sub if name in was else _nullable(sub) for name, sub in out["properties"].items()
    }
    out["required"] = list(out["properties"])
    out["additionalProperties"] = False


def _closed_object(out: dict[str, Any], original: dict[str, Any]) -> None:
    out.setdefault("additionalProperties", False)


def strict_schema(schema: Any) -> Any:
    """The schema as OpenAI's strict mode wants it, field order kept.

    Every object lists all its properties in ``required`` and forbids others; a
    property that was optional becomes nullable, so the reply says ``null`` where
    it would have left the field out.
    """
    return _rebuild(schema, _strict_object)


def closed_schema(schema: Any) -> Any:
    """The schema with every object that lists its properties forbidding others, unless it
    says otherwise (Anthropic's structured outputs want objects closed)."""
    return _rebuild(schema, _closed_object)


def is_schema_rejection(status: int, message: str) -> bool:
    """Whether an upstream's 400 refuses the schema (so the call can go without it)."""
    return status == 400 and any(p.search(message) for p in SCHEMA_REJECTION_PATTERNS)


def _valid(value: Any, schema: Any) -> bool:
    try:
        jsonschema.validate(value, schema)
    except (jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def reply_matches(text: str | None, schema: dict[str, Any]) -> bool:
    """Whether the reply's text is JSON that the schema accepts, as the caller wrote it or
    in the strict form the gateway may have sent (where an optional field may be null)."""
    if text is None:
        return False
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return _valid(value, schema) or _valid(value, strict_schema(schema))


def schema_verdict(
    text: str | None, finish_reason: str | None, schema: dict[str, Any]
) -> bool | None:
    """The call log's ``schema_valid``: whether the reply matches the schema, or None when
    the answer is tool calls, which carry no reply to check (the reply comes on a later turn)."""
    if finish_reason == "tool_calls":
        return None
    return reply_matches(text, schema)
