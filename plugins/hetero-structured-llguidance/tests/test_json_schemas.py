"""Random walks under the mask always give JSON that validates against its schema (checked by `jsonschema`)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from hetero_core.structured_output import StructuredOutput
from hetero_core.testing.structured_output import Walker
from hetero_structured_llguidance import LLGuidanceBackend

NAME = {"type": "string", "maxLength": 12}
SCHEMAS = {
    "flat object": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "optional fields": {
        "type": "object",
        "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "note": NAME},
        "required": ["city"],
        "additionalProperties": False,
    },
    "nested objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "address": {"type": "object", "properties": {"street": NAME}, "required": ["street"]},
                },
                "required": ["id", "address"],
            }
        },
        "required": ["user"],
    },
    "array of strings": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 4},
    "array of objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": NAME, "qty": {"type": "integer", "minimum": 1}},
                    "required": ["sku", "qty"],
                },
                "maxItems": 3,
            }
        },
        "required": ["items"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
    },
    "bounded numbers": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "minimum": -5, "maximum": 5},
            "big": {"type": "integer", "exclusiveMinimum": 100},
        },
        "required": ["score", "count", "big"],
    },
    "booleans and nulls": {
        "type": "object",
        "properties": {"done": {"type": "boolean"}, "parent": {"type": ["string", "null"], "maxLength": 8}},
        "required": ["done", "parent"],
    },
    "any of": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 6}]}},
        "required": ["value"],
    },
    "references": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "const and string formats": {
        "type": "object",
        "properties": {"version": {"const": 2}, "tag": {"type": "string", "pattern": "^v[0-9]\\.[0-9]$"}},
        "required": ["version", "tag"],
    },
}


@pytest.fixture(scope="module")
def walker(tokenizer):
    return Walker(tokenizer)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_walks_validate(backend, walker, name) -> None:
    schema = SCHEMAS[name]
    compiled = backend.compile(StructuredOutput.json_schema(schema))
    rng = random.Random(name)
    for _ in range(8):
        text = walker.text(walker.walk(backend.new_matcher(compiled), rng))
        jsonschema.validate(json.loads(text), schema)


def test_json_is_written_compactly_unless_whitespace_is_flexible(tokenizer, walker) -> None:
    constraint = StructuredOutput.json_schema(SCHEMAS["enums"])
    compact = LLGuidanceBackend(tokenizer)
    text = walker.text(walker.walk(compact.new_matcher(compact.compile(constraint)), random.Random(0)))
    assert text == json.dumps(json.loads(text))
    brace, newline = (tokenizer.encode(piece, add_special_tokens=False)[0] for piece in ("{", "\n"))
    flexible = LLGuidanceBackend(tokenizer, whitespace_flexible=True)
    for backend, accepts_newline in ((compact, False), (flexible, True)):
        matcher = backend.new_matcher(backend.compile(constraint))
        assert matcher.accept_token(brace)
        assert matcher.accept_token(newline) is accepts_newline


def test_the_grammar_cache_is_bounded(tokenizer) -> None:
    backend = LLGuidanceBackend(tokenizer, max_cached_grammars=2)
    for pattern in ("a+", "b+", "c+"):
        backend.compile(StructuredOutput.regex(pattern))
    assert backend.num_cached_grammars == 2
