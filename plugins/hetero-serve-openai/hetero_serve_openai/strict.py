"""OpenAI's ``strict: true`` for a JSON schema: an object holds only the keys its schema lists.

Plain JSON Schema lets an object hold keys its ``properties`` do not list
unless it says ``"additionalProperties": false``; OpenAI's strict mode never
does. :func:`strict_schema` writes that out: every object schema that lists
``properties`` or ``patternProperties`` and says nothing of
``additionalProperties`` (or ``unevaluatedProperties``) gets
``"additionalProperties": false``, at every depth (inside ``properties``,
``items``, ``anyOf``, ``$defs``, ...). Two cases differ:

- the members of an ``allOf`` combine their keys, so they stay open, and the
  schema that holds the ``allOf`` is closed over the keys of all of them;
- an object schema that lists no keys (``{"type": "object"}``) is a free-form
  map and stays open.
"""

from __future__ import annotations

from typing import Any

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
SCHEMA_VALUES = (
    "items",
    "additionalItems",
    "unevaluatedItems",
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
)
KEY_LISTS = ("properties", "patternProperties")


def strict_schema(schema: Any) -> Any:
    """``schema`` with every object closed to the keys it lists (a new value; ``schema`` is not changed)."""
    return _closed(schema, in_all_of=False)


def _closed(schema: Any, *, in_all_of: bool) -> Any:
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(closed.get(key), dict):
            closed[key] = {name: _closed(value, in_all_of=False) for name, value in closed[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(closed.get(key), list):
            closed[key] = [_closed(value, in_all_of=False) for value in closed[key]]
    for key in SCHEMA_VALUES:
        value = closed.get(key)
        if isinstance(value, list):  # items as a list (draft 4)
            closed[key] = [_closed(item, in_all_of=False) for item in value]
        elif isinstance(value, dict):
            closed[key] = _closed(value, in_all_of=False)
    members = closed.get("allOf")
    if isinstance(members, list):
        closed["allOf"] = [_closed(member, in_all_of=True) for member in members]
    if in_all_of or "additionalProperties" in closed or "unevaluatedProperties" in closed:
        return closed
    for key in (
        KEY_LISTS if isinstance(members, list) else ()
    ):  # the keys of every member, open here: they constrain there
        names = [name for member in members if isinstance(member, dict) for name in member.get(key) or {}]
        if names:
            closed[key] = {name: {} for name in names} | (closed.get(key) or {})
    if any(key in closed for key in KEY_LISTS):
        closed["additionalProperties"] = False
    return closed
