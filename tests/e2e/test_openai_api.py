"""End to end: the OpenAI-compatible routes (chat completions and completions) with the official `openai`
client, sync and async, and the APIs' documented request examples sent verbatim (only `model` names
the served model).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM

from client.bench import engine_stats
from frontend.app import create_app
from frontend.config import FrontendConfig
from tritonlm.text.tokenization import load_tokenizer

pytestmark = pytest.mark.usefixtures("servers")

HELLO = [{"role": "user", "content": "Hello, who are you?"}]
# Log probs against fp32 transformers: the engine's oneDNN projections (fuse_projections) sum in
# another order than transformers' MKL ones, ~1e-4 apart on a log prob.
LOGPROB_TOL = 3e-4


@pytest.fixture(scope="module")
def client(servers) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def model(servers) -> str:
    return servers.model_name


def post(servers, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(servers.frontend_url + path, json=body, timeout=timeout)


def sse(servers, path: str, body: dict) -> list:
    """The stream's events: JSON objects, then the final "[DONE]"."""
    events = []
    with httpx.stream("POST", servers.frontend_url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events[:-1]


def engine_stat(servers, name: str) -> float:
    stats = engine_stats(servers.metrics_url)
    assert name in stats, f"metric {name} missing"
    return stats[name]


def wait_until_idle(servers, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while engine_stat(servers, "running") or engine_stat(servers, "waiting"):
        assert time.monotonic() < deadline, "a cancelled request is still in the engine"
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# The openai client: streamed and not, sync and async.


def test_chat_streamed_equals_non_streamed(client, model):
    args = {"model": model, "messages": HELLO, "max_tokens": 12, "temperature": 0}
    full = client.chat.completions.create(**args)
    assert full.object == "chat.completion" and full.model == model
    [choice] = full.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    finished = [c for c in chunks if c.choices[0].finish_reason]
    assert len(finished) == 1 and finished[0] is chunks[-1]
    assert finished[0].choices[0].finish_reason == choice.finish_reason
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert getattr(chunks[-1].usage, name) == getattr(full.usage, name), name
    extra = full.usage.model_extra
    assert len(extra["batch_size"]) == len(extra["queue_wait_time"]) == full.usage.completion_tokens


def test_completions_async_streamed_equals_non_streamed(servers, model):
    async def scenario():
        aclient = openai.AsyncOpenAI(base_url=servers.frontend_url + "/v1", api_key="x", max_retries=0)
        args = {"model": model, "prompt": "The quick brown fox", "max_tokens": 10, "temperature": 0}
        full = await aclient.completions.create(**args)
        stream = await aclient.completions.create(**args, stream=True)
        chunks = [c async for c in stream]
        await aclient.close()
        return full, chunks

    full, chunks = asyncio.run(scenario())
    assert full.object == "text_completion"
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-1] == full.choices[0].finish_reason == "length"
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_n_and_seeds(client, model):
    """n=2 fans out two sequences seeded seed and seed + 1, each reproducible alone."""
    args = {"model": model, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.9}
    both = client.completions.create(**args, n=2, seed=5)
    assert [c.index for c in both.choices] == [0, 1]
    alone = [client.completions.create(**args, seed=s).choices[0].text for s in (5, 6)]
    assert [c.text for c in both.choices] == alone
    assert both.usage.completion_tokens == 12
    chat = client.chat.completions.create(model=model, messages=HELLO, max_tokens=4, n=2, seed=1)
    assert [c.index for c in chat.choices] == [0, 1]


def test_best_of_returns_the_most_likely(client, model):
    args = {"model": model, "prompt": "Random words:", "max_tokens": 5, "temperature": 1.0}
    best = client.completions.create(**args, best_of=3, seed=11)
    scores = {}
    for seed in (11, 12, 13):
        c = client.completions.create(**args, seed=seed, logprobs=0).choices[0]
        scores[c.text] = sum(c.logprobs.token_logprobs)
    assert best.choices[0].text == max(scores, key=scores.get)
    assert best.choices[0].logprobs is None  # ranking needed log probs; nobody asked to see them


# ---------------------------------------------------------------------------------------------
# Log probs: shapes, and values against a transformers forward pass.


@pytest.fixture(scope="module")
def hf_model(servers):
    return AutoModelForCausalLM.from_pretrained(servers.model_dir).eval()


def _reference(hf_model, ids: list[int], temperature: float) -> torch.Tensor:
    """log_softmax of the logits after temperature (greedy: temperature 1), for every position."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return (logits / (temperature or 1.0)).log_softmax(-1)


def _tgi_ids(servers, prompt: str, max_tokens: int, temperature: float, seed: int) -> tuple[list, list]:
    """Prompt and generated ids of the same request through TGI's route, which reports ids."""
    parameters = {"max_new_tokens": max_tokens, "details": True, "decoder_input_details": True}
    if temperature:
        parameters |= {"temperature": temperature, "seed": seed}
    details = post(servers, "/", {"inputs": prompt, "parameters": parameters}).json()[0]["details"]
    return [t["id"] for t in details["prefill"]], [t["id"] for t in details["tokens"]]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_completion_logprobs_match_transformers(servers, client, model, hf_model, temperature):
    prompt, k = "The capital of France is", 3
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=temperature, seed=3, logprobs=k, echo=True
    ).choices[0]
    prompt_ids, ids = _tgi_ids(servers, prompt, 6, temperature, 3)
    ref = _reference(hf_model, prompt_ids + ids, temperature)
    lp = out.logprobs
    n_prompt = len(prompt_ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == n_prompt + len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0 and out.text.startswith(prompt)
    assert all(
        b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens, strict=False)
    )
    every = prompt_ids + ids
    for pos in range(1, len(every)):
        expected = ref[pos - 1]
        assert lp.token_logprobs[pos] == pytest.approx(expected[every[pos]].item(), abs=LOGPROB_TOL), pos
        top = lp.top_logprobs[pos]
        assert 1 <= len(top) <= k + 1
        for value in expected.topk(k).values.tolist():
            assert any(abs(v - value) < LOGPROB_TOL for v in top.values()), (pos, top, value)


def test_chat_logprobs_shape_and_values(servers, client, model, hf_model):
    out = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)  # greedy: the best
        assert entry.bytes == list(entry.token.encode())
    only = client.chat.completions.create(model=model, messages=HELLO, max_tokens=2, logprobs=True)
    assert all(e.top_logprobs == [] for e in only.choices[0].logprobs.content)
    assert (
        client.chat.completions.create(model=model, messages=HELLO, max_tokens=2).choices[0].logprobs is None
    )


# ---------------------------------------------------------------------------------------------
# Stop strings, stop tokens, ignore_eos, finish reasons.


def _free(client, model, prompt: str, n: int = 24):
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=n, temperature=0, logprobs=0
    ).choices[0]


def test_stop_string_across_token_boundaries(servers, client, model):
    prompt = "Tell me a story about"
    free = _free(client, model, prompt)
    offsets, tokens = free.logprobs.text_offset, free.logprobs.tokens
    # A stop string that starts inside one token and ends inside the next.
    k = next(i for i in range(2, len(tokens) - 1) if len(tokens[i]) >= 2 and len(tokens[i + 1]) >= 2)
    stop = free.text[offsets[k] + 1 : offsets[k + 1] + 1]
    cut = free.text.index(stop)
    out = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    choice = out.choices[0]
    assert choice.text == free.text[:cut] and choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop
    assert out.usage.completion_tokens <= k + 2  # the engine stopped there, not at max_tokens
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "stop": stop,
        "stream": True,
    }
    events = sse(servers, "/v1/completions", body)
    assert "".join(e["choices"][0]["text"] for e in events) == free.text[:cut]
    keep = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        stop=stop,
        extra_body={"include_stop_str_in_output": True},
    )
    assert keep.choices[0].text == free.text[: cut + len(stop)]


def test_stop_token_ids(servers, client, model):
    prompt = "Hello"
    _, ids = _tgi_ids(servers, prompt, 12, 0.0, 0)
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    free = _free(client, model, prompt, 12).text
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, extra_body={"stop_token_ids": [ids[k]]}
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == ids[k]
    assert out.usage.completion_tokens == k + 1
    assert free.startswith(choice.text)


def test_end_tokens_and_ignore_eos(servers, client, model, hf_model):
    """The tokenizer's EOS and generation_config's other EOS (<|im_end|>, a chat turn's end) both
    stop generation, and neither appears in the text; ignore_eos generates on to max_tokens."""
    tokenizer = load_tokenizer(servers.model_dir)
    ends = {
        tokenizer.eos_token_id: "end of text",
        tokenizer.convert_tokens_to_ids("<|im_end|>"): "end of turn",
    }
    # One-token prompts after which the greedy choice is an end token (the tiny model's weights
    # are random, so they are found, not known).
    with torch.no_grad():
        candidates = torch.arange(5, len(tokenizer))
        following = hf_model(candidates[:, None]).logits[:, -1].argmax(-1).tolist()
    prompts = {}
    for token, after in zip(candidates.tolist(), following, strict=True):
        text = tokenizer.decode([token])
        if after in ends and tokenizer.encode(text) == [token]:
            prompts.setdefault(after, text)
    assert prompts, "no prompt of the tiny model ends right away"
    for end, prompt in prompts.items():
        args = {"model": model, "prompt": prompt, "max_tokens": 5, "temperature": 0}
        out = client.completions.create(**args)
        assert out.choices[0].finish_reason == "stop", ends[end]
        assert out.usage.completion_tokens == 1 and out.choices[0].text == ""
        assert out.choices[0].model_extra["stop_reason"] is None
        again = client.completions.create(**args, extra_body={"ignore_eos": True})
        assert again.choices[0].finish_reason == "length" and again.usage.completion_tokens == 5


def test_chat_template_kwargs_reach_the_template(client, model):
    plain = client.chat.completions.create(model=model, messages=HELLO, max_tokens=1)
    thinking_off = client.chat.completions.create(
        model=model,
        messages=HELLO,
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    # The default template adds an empty <think></think> block when thinking is off.
    assert thinking_off.usage.prompt_tokens > plain.usage.prompt_tokens


# ---------------------------------------------------------------------------------------------
# Errors


BAD_CHAT = [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2**31}, "max_tokens"),
    ({"max_tokens": 5000}, "max_tokens"),  # more than the context: reported by the engine
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"best_of": 129}, "best_of"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"n": 2, "temperature": 0}, "n"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2, "logprobs": False}, "top_logprobs"),
    ({"stop": [""]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": [4096]}, "stop_token_ids"),  # beyond the vocabulary: reported by preprocessing
    ({"use_beam_search": True, "stop": ["x"]}, "stop"),
    ({"skip_special_tokens": "yes"}, "skip_special_tokens"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0]"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "a.png"}]}]},
        "messages[0].content[0]",
    ),
    ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(33)]}, "tools"),
    ({"tools": [{"type": "web", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "any"}, "tool_choice"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"store": True}, "store"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"verbosity": "low"}, "verbosity"),
    ({"prediction": {"type": "content", "content": "Hello"}}, "prediction"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
    ({"logit_bias": {"1000000": 1}}, "logit_bias"),  # past the vocabulary
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"functions": [{"name": "f"}], "tools": [{"type": "function", "function": {"name": "f"}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
]


@pytest.mark.parametrize(("patch", "param"), BAD_CHAT, ids=[str(i) for i in range(len(BAD_CHAT))])
def test_bad_chat_parameter_is_bad_request(client, model, patch, param):
    body = {"max_tokens": 2, **patch}
    messages = body.pop("messages", HELLO)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=messages, extra_body=body)
    assert e.value.param == param and e.value.type == "invalid_request_error", e.value.body
    assert param.split("[")[0] in e.value.message


BAD_COMPLETION = [
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"seed": 0}, "seed"),
    ({"top_k": 0}, "top_k"),
    ({"temperature": -1}, "temperature"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"echo": "true"}, "echo"),
    ({"best_of": 3, "n": 2, "stream": True}, "best_of"),
    ({"prompt": "hello " * 3000}, "prompt"),  # longer than the context
    ({"logit_bias": {"1000000": 1}}, "logit_bias"),  # past the vocabulary
    ({"logit_bias": {"5": -101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"suffix": "!"}, "suffix"),
]


@pytest.mark.parametrize(("patch", "param"), BAD_COMPLETION, ids=[str(i) for i in range(len(BAD_COMPLETION))])
def test_bad_completion_parameter_is_bad_request(client, model, patch, param):
    body = {"max_tokens": 2, **patch}
    prompt = body.pop("prompt", "Hi")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=prompt, extra_body=body)
    assert e.value.param == param, e.value.body


def test_unknown_model_is_404_and_the_embedding_model_400(servers, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=HELLO)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    embed = next(m.id for m in client.models.list().data if m.id != servers.model_name)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=embed, prompt="Hi")


# ---------------------------------------------------------------------------------------------
# OpenAI's other documented fields: accepted with no effect, logit_bias applied.

NO_EFFECT = {
    "user": "u-1",
    "metadata": {"team": "search"},
    "service_tier": "auto",
    "prompt_cache_key": "k-1",
    "safety_identifier": "hashed-id",
    "store": False,
}


def test_fields_with_no_effect_are_answered_unchanged(client, model):
    args = {"model": model, "messages": HELLO, "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**args)
    answered = client.chat.completions.create(**args, **NO_EFFECT, modalities=["text"], logit_bias={})
    assert answered.choices[0].message.content == plain.choices[0].message.content
    with_effort = client.chat.completions.create(**args, reasoning_effort="medium")
    assert with_effort.choices[0].finish_reason in ("stop", "length")
    args = {"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0}
    plain_text = client.completions.create(**args).choices[0].text
    assert client.completions.create(**args, user="u-1", extra_body=NO_EFFECT).choices[0].text == plain_text


def greedy_token(servers, prompt: str) -> int:
    """The id of the token greedy decoding writes first after `prompt` (TGI's details list ids)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 1, "details": True}}
    return post(servers, "/generate", body).json()["details"]["tokens"][0]["id"]


def test_logit_bias_forces_and_bans_tokens(client, model, servers):
    prompt = "The capital of France is"
    first = greedy_token(servers, prompt)
    args = {"model": model, "prompt": prompt, "max_tokens": 3, "temperature": 0}
    plain = client.completions.create(**args).choices[0].text
    # -100 on the greedy first token: another token comes first.
    one = {**args, "max_tokens": 1}
    banned = client.completions.create(**one, logit_bias={str(first): -100}).choices[0].text
    assert banned != client.completions.create(**one).choices[0].text
    # +100 on one token: greedy writes only it, on both APIs.
    forced = post(servers, "/tokenize", {"prompt": " Paris"}).json()["tokens"][-1]
    assert forced != first
    text = post(servers, "/detokenize", {"tokens": [forced] * 3}).json()["prompt"]
    assert client.completions.create(**args, logit_bias={str(forced): 100}).choices[0].text == text != plain
    chat = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=3, temperature=0, logit_bias={str(forced): 100}
    )
    assert chat.choices[0].message.content == text


# ---------------------------------------------------------------------------------------------
# Disconnects free the engine.


def test_disconnected_clients_leave_no_request_in_the_engine(servers, model):
    body = {"model": model, "messages": HELLO, "max_tokens": 1500, "ignore_eos": True, "stream": True, "n": 2}
    with httpx.stream("POST", servers.frontend_url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(line for line in lines if line.startswith("data:"))
    wait_until_idle(servers)
    body = {
        "model": model,
        "prompt": "Go on",
        "max_tokens": 1500,
        "ignore_eos": True,
        "n": 2,
        "temperature": 1,
    }
    with pytest.raises(httpx.ReadTimeout):
        post(servers, "/v1/completions", body, timeout=1.0)
    wait_until_idle(servers)


# ---------------------------------------------------------------------------------------------
# Seed examples, verbatim but for `model`.

EXAMPLES = json.loads((Path(__file__).parent / "data" / "openai_request_examples.json").read_text())
CHAT_SINGLE = EXAMPLES["chat_completions"]["chat_single_turn"]
CHAT_MULTIMODAL = EXAMPLES["chat_completions"]["chat_multimodal"]
CHAT_FIRST_TURN = EXAMPLES["chat_completions"]["chat_first_turn"]
CHAT_SECOND_TURN = EXAMPLES["chat_completions"]["chat_second_turn"]
COMPLETIONS_STREAM = EXAMPLES["completions"]["completions_stream"]
COMPLETIONS_TEXT = EXAMPLES["completions"]["completions_text"]

USAGE_KEYS = {
    "prompt_tokens",
    "prompt_tokens_details",
    "completion_tokens",
    "total_tokens",
    "batch_size",
    "queue_wait_time",
}


def _check_usage(usage: dict, completion_tokens: int | None = None, steps: int | None = None) -> None:
    """`steps`: timing entries, when not one per completion token (beams share their steps)."""
    assert set(usage) == USAGE_KEYS
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens"}
    assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
    entries = usage["completion_tokens"] if steps is None else steps
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == entries
    assert all(isinstance(v, int) and v >= 1 for v in usage["batch_size"])
    assert all(isinstance(v, int) and v >= 0 for v in usage["queue_wait_time"])
    if completion_tokens is not None:
        assert usage["completion_tokens"] == completion_tokens


@pytest.mark.parametrize("example", [CHAT_SINGLE, CHAT_FIRST_TURN, CHAT_SECOND_TURN])
def test_chat_examples(servers, model, example):
    r = post(servers, "/v1/chat/completions", {**example, "model": model})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prefill_time",
        "decode_time_arr",
    }
    assert body["object"] == "chat.completion" and body["model"] == model
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["message"]["tool_calls"] == [] and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    _check_usage(body["usage"])
    assert choice["finish_reason"] == "stop" or body["usage"]["completion_tokens"] == example["max_tokens"]
    assert isinstance(body["prefill_time"], int)
    assert len(body["decode_time_arr"]) == body["usage"]["completion_tokens"] - 1


def test_chat_multimodal_example_is_refused_by_a_text_model(servers, model):
    r = post(servers, "/v1/chat/completions", {**CHAT_MULTIMODAL, "model": model})
    assert r.status_code == 400
    error = r.json()["error"]
    assert "text-only" in error["message"] and error["param"].startswith("messages[0].content")


def test_chat_stream_shapes(servers, model):
    events = sse(servers, "/v1/chat/completions", {**CHAT_SINGLE, "model": model, "stream": True})
    for event in events:
        assert event["object"] == "chat.completion.chunk" and event["id"] == events[0]["id"]
        [choice] = event["choices"]
        assert choice["delta"]["role"] == "assistant" and isinstance(choice["delta"]["content"], str)
    assert [e["choices"][0]["finish_reason"] is not None for e in events] == [False] * (len(events) - 1) + [
        True
    ]
    assert ["usage" in e for e in events] == [False] * (len(events) - 1) + [True]
    _check_usage(events[-1]["usage"])


def test_full_text_stream_mode(servers, model):
    """The server setting of chat completions' second streaming example: cumulative text, full_text last."""
    app = create_app(
        FrontendConfig(triton_urls=servers.grpc_url, served_model_name=model, stream_full_text=True)
    )
    body = {"model": model, "messages": HELLO, "max_tokens": 8, "temperature": 0, "stream": True}
    with TestClient(app) as local:
        text = local.post("/v1/chat/completions", json=body).text
        plain = local.post("/v1/chat/completions", json={**body, "stream": False}).json()
    events = [json.loads(c.removeprefix("data: ")) for c in text.split("\n\n") if c and c != "data: [DONE]"]
    contents = [e["choices"][0]["delta"]["content"] for e in events]
    assert all(b.startswith(a) for a, b in zip(contents, contents[1:], strict=False))
    assert contents[-1] == events[-1]["full_text"] == plain["choices"][0]["message"]["content"]
    assert "full_text" not in events[0] or len(events) == 1


def test_completions_text_example(servers, model):
    r = post(servers, "/v1/completions", {**COMPLETIONS_TEXT, "model": model})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        assert set(choice) == {"index", "text", "logprobs", "stop_reason", "finish_reason"}
        assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
        lp = choice["logprobs"]
        assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
        # The chosen token and its 2 best alternatives, keyed by text: tokens that decode to the
        # same text (byte pieces of one character) share an entry, so a sampled run may have 1.
        pairs = zip(lp["tokens"], lp["top_logprobs"], strict=True)
        assert all(token in top and 1 <= len(top) <= 3 for token, top in pairs)
    _check_usage(body["usage"], completion_tokens=10)


def test_completions_beam_search_stream_example(servers, model):
    """Beam search streams "fake": one chunk with every beam, and the usage."""
    events = sse(servers, "/v1/completions", {**COMPLETIONS_STREAM, "model": model})
    [chunk] = events
    assert chunk["object"] == "text_completion" and [c["index"] for c in chunk["choices"]] == [0, 1]
    for choice in chunk["choices"]:
        assert choice["finish_reason"] == "length" and len(choice["logprobs"]["tokens"]) == 5
    _check_usage(chunk["usage"], completion_tokens=10, steps=5)
