"""Documents, in /openapi.json, every error status each route can answer, with its body: generated
clients and fuzzers then see what the server really does. FastAPI alone documents a 422 with its
own validation body, which our routes never send (TGI's routes send TGI's error body, OpenAI's and
Databricks' routes say 400). Model names are this server's models (an enum: any other name is a 404),
so generated clients offer them and a fuzzer's requests get past the model lookup to the generation."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from frontend.errors import ANTHROPIC_PATHS, OPENAI_PREFIXES, anthropic_status
from frontend.ops.auth import OPEN_PATHS

TGI_ERROR = "TGIError"
OPENAI_ERROR = "OpenAIError"
ANTHROPIC_ERROR = "AnthropicError"
SCHEMAS = {
    TGI_ERROR: {
        "title": TGI_ERROR,
        "type": "object",
        "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
        "required": ["error", "error_type"],
    },
    OPENAI_ERROR: {
        "title": OPENAI_ERROR,
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                },
                "required": ["message", "type", "param", "code"],
            }
        },
        "required": ["error"],
    },
    ANTHROPIC_ERROR: {
        "title": ANTHROPIC_ERROR,
        "type": "object",
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                "required": ["type", "message"],
            },
        },
        "required": ["type", "error"],
    },
}
WHY = {
    400: "Invalid request: the message (and `param`, OpenAI's shape) name the field or content part and "
    "what is allowed",
    401: "Missing or wrong API key (only when the server has API keys)",
    404: "Unknown model, endpoint or stored response",
    413: "Request body larger than the server's limit",
    422: "Invalid request: the message names the field and what is allowed",
    429: "The engine's queue is full: retry after `Retry-After` seconds",
    503: "Triton is not serving (starting, restarting or down): retry after `Retry-After` seconds",
    529: "Triton is not serving (starting, restarting or down): retry after `Retry-After` seconds "
    "(Anthropic's overloaded_error)",
}
# Routes that queue in the engine, which refuses work past its queue bound (429); loading an adapter
# checks it with one engine request.
_GENERATION_PATHS = (
    "/", "/generate", "/generate_stream", "/v1/chat/completions", "/v1/completions", "/v1/messages",
    "/v1/responses", "/v1/load_lora_adapter",
)  # fmt: skip
_TGI_GENERATION_PATHS = ("/", "/generate", "/generate_stream")
# Routes that read or delete a stored object by id: 404 for an unknown id, 400 for a query parameter.
_STORED_PATHS = ("/v1/responses/{response_id}",)


def statuses(path: str, method: str) -> list[int]:
    """The error statuses of one operation."""
    if path == "/health":
        return [503]
    codes = [] if path in OPEN_PATHS else [401]
    if method != "post":
        if path == "/info":  # it asks Triton for the engine settings
            return codes + [503]
        return sorted(codes + [400, 404]) if path in _STORED_PATHS else codes
    openai = path.startswith(OPENAI_PREFIXES)
    codes += [400, 404] if openai else [422]
    if path in _TGI_GENERATION_PATHS:  # TGI's refuse media content parts with 400 (frontend.media.attach)
        codes.append(400)
    codes += [413, 503]
    if path in _GENERATION_PATHS or path.startswith("/serving-endpoints/"):
        codes.append(429)
    if path in ANTHROPIC_PATHS:
        codes = [anthropic_status(code) for code in codes]
    return sorted(codes)


def document_errors(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        for path, operations in schema.get("paths", {}).items():
            body = OPENAI_ERROR if path.startswith(OPENAI_PREFIXES) else TGI_ERROR
            body = ANTHROPIC_ERROR if path in ANTHROPIC_PATHS else body
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)  # FastAPI's validation body; ours replaces it where sent
                for status in statuses(path, method):
                    responses[str(status)] = {
                        "description": WHY[status],
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
                    }
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        _model_examples(schema, list(app.state.served_models), app.state.embed_model_name)
        components.update(SCHEMAS)
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _model_examples(schema: dict[str, Any], models: list[str], embed_model: str) -> None:
    """`models`: the generative models' names (those served at start-up)."""
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        if "model" in component.get("properties", {}):
            names = [embed_model] if "Embedding" in name else models
            field = component["properties"]["model"]
            if "anyOf" in field:  # optional: null or one of the names
                field["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
            else:
                field["enum"] = names
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "name":  # a Databricks endpoint
                    parameter["schema"]["enum"] = [*models, embed_model]
