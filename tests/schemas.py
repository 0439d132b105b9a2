"""Generated JSON schemas for structured-output tests: objects, arrays, enums, anyOf, integer
ranges, string patterns and lengths, nested. Every one is finite (bounded strings, arrays and
integers; no free properties), so even a random-weight model finishes it."""

from __future__ import annotations

import random
from typing import Any


def _leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["int", "string", "pattern", "enum", "bool", "const", "null"])
    if kind == "int":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 200)}
    if kind == "string":
        low = rng.randint(0, 2)
        return {"type": "string", "minLength": low, "maxLength": low + rng.randint(0, 4)}
    if kind == "pattern":
        pattern = rng.choice([r"^[a-z]{2,4}$", r"^[0-9]{3}-[A-Z]$", r"^(ab|cd){1,3}x$"])
        return {"type": "string", "pattern": pattern}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, None, True], rng.randint(1, 4))}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    return {"type": "null"}


def _value(rng: random.Random, depth: int) -> dict[str, Any]:
    kind = rng.choice(["leaf", "leaf", "array", "anyOf", "object"] if depth < 2 else ["leaf"])
    if kind == "array":
        low = rng.randint(0, 1)
        return {"type": "array", "items": _leaf(rng), "minItems": low, "maxItems": low + rng.randint(0, 2)}
    if kind == "anyOf":
        return {"anyOf": [_leaf(rng), _leaf(rng)]}
    if kind == "object":
        return _object(rng, depth + 1)
    return _leaf(rng)


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(["id", "name", "size", "tags", "ok", "kind", "when"], rng.randint(1, 3))
    return {
        "type": "object",
        "properties": {n: _value(rng, depth) for n in names},
        "required": names,
        "additionalProperties": False,
    }


def generated_schemas(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    schemas = [_object(rng, 0) for _ in range(count - 1)]
    # A top-level array of objects, too.
    schemas.append({"type": "array", "items": _object(rng, 1), "minItems": 1, "maxItems": 2})
    return schemas
