"""The real default model, SmolLM2-135M-Instruct (converted by `make setup`), end to end on the
package's servers (conftest.py: beside the tiny model): a chat answer that makes sense, and served
greedy output equal to transformers `generate` under concurrency. Few and short: each token costs
~65 ms on a 2-core CPU."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import Servers

from . import API_KEY, USER

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]
NEW_TOKENS = 10


def test_chat_answers_the_question(real: Servers) -> None:
    body = {
        "model": real.model_name,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    response = httpx.post(f"{real.frontend_url}/v1/chat/completions", json=body, headers=USER, timeout=120)
    assert response.status_code == 200, response.text
    assert "Paris" in response.json()["choices"][0]["message"]["content"]


def test_served_greedy_equals_transformers_generate(real: Servers) -> None:
    def served(prompt: str) -> list[int]:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True}}
        response = httpx.post(f"{real.frontend_url}/", json=body, headers=USER, timeout=120)
        assert response.status_code == 200, response.text
        return [token["id"] for token in response.json()[0]["details"]["tokens"]]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrently: one batch in the engine
        got = list(pool.map(served, PROMPTS))

    tokenizer = AutoTokenizer.from_pretrained(real.model_dir)
    model = AutoModelForCausalLM.from_pretrained(real.model_dir, dtype=torch.float32)
    for prompt, ids in zip(PROMPTS, got, strict=True):
        inputs = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        expected = out[0, inputs["input_ids"].shape[1] :].tolist()
        assert ids == expected, (prompt, ids, expected)


def test_a_required_tool_call_names_the_tool_with_paris(real: Servers) -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
            },
        },
    }
    client = openai.OpenAI(base_url=real.frontend_url + "/v1", api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(
        model=real.model_name,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[weather],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and "Paris" in call.function.arguments


def test_a_final_answer_after_a_tool_round_with_tool_choice_none(real: Servers) -> None:
    """What agents send to force an answer: the call, its result, and tool_choice none. SmolLM2's
    template knows no tools, so the round is written into the conversation as text."""
    client = openai.OpenAI(base_url=real.frontend_url + "/v1", api_key=API_KEY, max_retries=0)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'},
    }
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    for choice in ("none", "auto"):
        reply = client.chat.completions.create(
            model=real.model_name,
            messages=messages,
            tools=[weather],
            tool_choice=choice,
            max_tokens=8,
            temperature=0,
        )
        assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    none = client.chat.completions.create(
        model=real.model_name,
        messages=messages,
        tools=[weather],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert none.choices[0].message.content and not none.choices[0].message.tool_calls
