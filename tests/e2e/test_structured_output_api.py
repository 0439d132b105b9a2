"""Structured output end to end (real tritonserver + frontend, the tiny random-weight model):
OpenAI's response_format and vLLM's structured_outputs, Databricks' response_format, TGI's
grammar, the gRPC ensemble's guided_decoding tensors, and the errors that name the field."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pydantic
import pytest
from schemas import generated_schemas

from client.stream import StreamClient

pytestmark = pytest.mark.usefixtures("servers")

MESSAGES = [{"role": "user", "content": "Describe a thing as JSON."}]
FREE_PROMPTS = ["The weather today", "Once upon a time", "Numbers: 1, 2", "Hello"]


def post(servers, path: str, body: dict) -> httpx.Response:
    return httpx.post(servers.frontend_url + path, json=body, timeout=120)


async def _ask(client: httpx.AsyncClient, path: str, body: dict) -> tuple[str, str]:
    """(text, finish_reason) of one choice, streamed or not."""
    if not body.get("stream"):
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"], choice[
            "finish_reason"
        ]
    text, reason = "", None
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                reason = choice.get("finish_reason") or reason
    return text, reason


def _free(model: str, prompt: str) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}


def _constrained(model: str, i: int, schema: dict) -> tuple[str, dict]:
    """Chat with response_format, or completions with structured_outputs; every third streamed."""
    stream = i % 3 == 0
    if i % 2:
        format = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        body = {"model": model, "messages": MESSAGES, "response_format": format, "max_tokens": 400}
        path = "/v1/chat/completions"
    else:
        body = {"model": model, "prompt": "JSON:", "structured_outputs": {"json": schema}, "max_tokens": 400}
        path = "/v1/completions"
    return path, {**body, "stream": stream, "temperature": 0}


def test_generated_schemas_validate_streamed_or_not_beside_unchanged_free_requests(servers):
    model = servers.model_name
    schemas = generated_schemas(24)

    async def scenario():
        async with httpx.AsyncClient(base_url=servers.frontend_url, timeout=300) as client:
            alone = [await _ask(client, "/v1/completions", _free(model, p)) for p in FREE_PROMPTS]
            mixed = await asyncio.gather(
                *(_ask(client, *_constrained(model, i, s)) for i, s in enumerate(schemas)),
                *(_ask(client, "/v1/completions", _free(model, p)) for p in FREE_PROMPTS),
            )
            return alone, mixed

    alone, mixed = asyncio.run(scenario())
    assert mixed[len(schemas) :] == alone  # greedy outputs unchanged by the concurrent masks
    for schema, (text, reason) in zip(schemas, mixed, strict=False):
        assert reason == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)


def test_the_openai_sdk_parses_into_a_pydantic_model(servers):
    class Item(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=5)
        count: int = pydantic.Field(ge=0, le=9)
        ok: bool

    client = openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="x", max_retries=0)
    completion = client.chat.completions.parse(
        model=servers.model_name, messages=MESSAGES, response_format=Item, temperature=0, max_tokens=200
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, Item) and completion.choices[0].finish_reason == "stop"


def test_json_object_regex_choice_and_grammar(servers):
    model = servers.model_name
    r = post(
        servers,
        "/v1/completions",
        {
            "model": model,
            "prompt": "x",
            "max_tokens": 20,
            "temperature": 0,
            "structured_outputs": {"regex": "[0-9]{3}-(yes|no)"},
        },
    )
    assert r.status_code == 200 and re.fullmatch("[0-9]{3}-(yes|no)", r.json()["choices"][0]["text"])
    choices = ["red car", "a.b (c)", "blue"]
    r = post(
        servers,
        "/v1/completions",
        {
            "model": model,
            "prompt": "x",
            "max_tokens": 20,
            "n": 3,
            "seed": 1,
            "structured_outputs": {"choice": choices},
        },
    )
    assert r.status_code == 200 and all(c["text"] in choices for c in r.json()["choices"])
    grammar = 'root ::= "(" [a-c] ("," [a-c])? ")"'
    r = post(
        servers,
        "/v1/chat/completions",
        {"model": model, "messages": MESSAGES, "max_tokens": 20, "structured_outputs": {"grammar": grammar}},
    )
    assert r.status_code == 200 and re.fullmatch(
        r"\([a-c](,[a-c])?\)", r.json()["choices"][0]["message"]["content"]
    )
    r = post(
        servers,
        "/v1/chat/completions",
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": 300,
            "response_format": {"type": "json_object"},
            "temperature": 0,
        },
    )
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["message"]["content"].startswith("{")
    if choice["finish_reason"] == "stop":  # any object: a random model may not close it in time
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_databricks_response_format_and_tgi_grammar(servers):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["n"],
        "additionalProperties": False,
    }
    body = {
        "messages": MESSAGES,
        "max_tokens": 50,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    r = post(servers, f"/serving-endpoints/{servers.model_name}/invocations", body)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)
    for grammar, check in (
        ({"type": "json", "value": schema}, lambda t: jsonschema.validate(json.loads(t), schema)),
        ({"type": "json", "value": json.dumps(schema)}, lambda t: jsonschema.validate(json.loads(t), schema)),
        ({"type": "regex", "value": "[xy]{4}"}, lambda t: re.fullmatch("[xy]{4}", t) or pytest.fail(t)),
    ):
        r = post(servers, "/", {"inputs": "Go", "parameters": {"max_new_tokens": 50, "grammar": grammar}})
        assert r.status_code == 200, r.text
        body = r.json()
        check((body[0] if isinstance(body, list) else body)["generated_text"])


def test_the_grpc_ensemble_takes_the_guided_decoding_tensors(servers):
    client = StreamClient(servers.grpc_url)
    try:
        values = {
            "text_input": ["Go"],
            "max_tokens": 20,
            "guided_decoding_guide_type": "regex",
            "guided_decoding_guide": "(ab){2}c",
        }
        text = b"".join(b"".join(o["text_output"]) for o in client.generate("ensemble", values))
    finally:
        client.close()
    assert text.decode() == "ababc"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            400,
            "response_format",
        ),
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, 400, "response_format.type"),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema"}},
            400,
            "response_format.json_schema",
        ),
        ("/v1/completions", {"structured_outputs": {"regex": "a("}}, 400, "structured_outputs"),
        (
            "/v1/completions",
            {"structured_outputs": {"regex": "b("}, "stream": True},
            400,
            "structured_outputs",
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            400,
            "structured_outputs",
        ),
        # The grammar is complete after one token, but min_tokens bans the end: nothing is allowed.
        (
            "/v1/completions",
            {"structured_outputs": {"choice": ["a"]}, "min_tokens": 3},
            400,
            "structured_outputs",
        ),
        (
            "/v1/completions",
            {"structured_outputs": {"grammar": "root ::= nothing"}},
            400,
            "structured_outputs",
        ),
        (
            "/v1/completions",
            {
                "response_format": {"type": "json_object"},
                "use_beam_search": True,
                "best_of": 2,
                "temperature": 0,
            },
            400,
            "response_format",
        ),
        (
            "/serving-endpoints/{model}/invocations",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            400,
            "response_format.json_schema.name",
        ),
    ],
)
def test_bad_guides_fail_alone_naming_the_field(servers, path, body, status, param):
    model = servers.model_name
    body = {**body, "max_tokens": 5}
    if "completions" in path and path.endswith("chat/completions") or "invocations" in path:
        body["messages"] = MESSAGES
    else:
        body["prompt"] = "x"
    if path.startswith("/v1"):
        body["model"] = model
    r = post(servers, path.format(model=model), body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error


def test_tgi_bad_grammar_is_422(servers):
    for grammar in ({"type": "regex", "value": "a("}, {"type": "yaml", "value": "x"}, {"type": "json"}):
        r = post(servers, "/", {"inputs": "Go", "parameters": {"grammar": grammar}})
        assert r.status_code == 422, r.text
        assert "grammar" in r.json()["error"]
