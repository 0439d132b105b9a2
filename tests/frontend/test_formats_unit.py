"""The response formats, directly: OpenAI's chat and completion shapes, Databricks' variants of
them, and the Stream that turns engine steps into chunks (no routes, no Triton)."""

from __future__ import annotations

from frontend.databricks.format import DatabricksChatFormat, DatabricksCompletionFormat
from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation, Prompt, Step, Token, TopToken
from frontend.openai_api.chat_format import ChatFormat
from frontend.openai_api.completion_format import CompletionFormat
from frontend.openai_api.format import Stream, usage


def token(id: int, text: str, logprob: float = -0.5) -> Token:
    return Token(id, text, logprob, False, [TopToken(id + 1, text + "?", -2.0)])


STEPS = [
    Step("Hel", [token(1, "Hel")], "", 3, cached_tokens=1, prefill_ms=4.4, batch_sizes=[1], decode_ms=[4.4]),
    Step("lo", [token(2, "lo")], "", None, batch_sizes=[2], queue_wait_us=[5], decode_ms=[1.6]),
    Step("", [token(9, "")], "stop_words", None, batch_sizes=[2], decode_ms=[2.0]),
]


def generation() -> Generation:
    gen = Generation()
    for step in STEPS:
        gen.add(step)
    return gen


def chunks(fmt, job: Job, prompt: Prompt | None = None) -> list[dict]:
    stream = Stream(fmt, [job], [prompt])
    out = [stream.push(0, step) for step in STEPS]
    assert stream.done
    return out


def test_usage_counts_each_prompt_once_and_every_token():
    u = usage([Job(n=2), Job()], [[generation(), generation()], [generation()]])
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens) == (6, 9, 15, 2)
    assert u.batch_size == [1, 2, 2] * 3 and u.decode_ms == [1.6, 2.0] * 3 and u.prefill_ms == 4.4


def test_chat_response():
    fmt = ChatFormat("m", id="chatcmpl-1", created=7)
    body = fmt.response([Job(messages=[], logprobs=1)], [[generation()]], [None])
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prefill_time",
        "decode_time_arr",
    ]
    assert body["object"] == "chat.completion" and body["decode_time_arr"] == [2, 2]
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello", "tool_calls": []}
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"]["content"][0]["top_logprobs"] == [
        {"token": "Hel?", "logprob": -2.0, "bytes": [72, 101, 108, 63]}
    ]
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    assert body["usage"]["queue_wait_time"] == [5]


def test_chat_stream_deltas_and_the_cumulative_mode():
    first, _, last = chunks(ChatFormat("m"), Job(messages=[]))
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}
    ]
    assert last["choices"][0]["finish_reason"] == "stop" and last["usage"]["total_tokens"] == 6
    _, second, last = chunks(ChatFormat("m", full_text=True), Job(messages=[], stream_usage=False))
    assert second["choices"][0]["delta"]["content"] == "Hello"
    assert last["full_text"] == "Hello" and "usage" not in last


def test_databricks_chat_shapes():
    fmt = DatabricksChatFormat("m")
    body = fmt.response([Job(messages=[])], [[generation()]], [None])
    assert body["object"] == "chat.completions" and "prefill_time" not in body
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}  # no empty tool_calls
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_completion_response_with_echo_suffix_logprobs_and_stop_reason():
    job = Job(prompt="Say", echo=True, suffix=".", logprobs=1, stop_token_ids=[9])
    prompt = Prompt([4], ["Say"])
    fmt = CompletionFormat("m", id="cmpl-1")
    assert fmt.lists_prompt(job) and not fmt.lists_prompt(Job(prompt="x", echo=True))
    body = fmt.response([job], [[generation()]], [prompt])
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]
    (choice,) = body["choices"]
    assert list(choice) == ["index", "text", "logprobs", "stop_reason", "finish_reason"]
    assert choice["text"] == "SayHello." and choice["stop_reason"] == 9
    assert choice["logprobs"]["tokens"] == ["Say", "Hel", "lo", ""]
    assert choice["logprobs"]["text_offset"] == [0, 3, 6, 8]
    assert choice["logprobs"]["top_logprobs"][:2] == [None, {"Hel": -0.5, "Hel?": -2.0}]


def test_completion_stream_echoes_first_and_appends_the_suffix_last():
    job = Job(prompt="Say", echo=True, suffix=".", logprobs=0)
    first, second, last = chunks(CompletionFormat("m"), job, Prompt([4], ["Say"]))
    assert first["choices"][0]["text"] == "SayHel" and second["choices"][0]["text"] == "lo"
    assert first["choices"][0]["logprobs"]["tokens"] == ["Say", "Hel"]
    assert first["choices"][0]["stop_reason"] is None
    assert last["choices"][0]["text"] == "." and last["choices"][0]["finish_reason"] == "stop"
    _, second, last = chunks(CompletionFormat("m", full_text=True), Job(prompt="Say", echo=True))
    assert second["choices"][0]["text"] == "SayHello" and last["full_text"] == "SayHello"


def test_databricks_completion_shapes():
    job = Job(prompt="Say", echo=True, logprobs=0)
    fmt = DatabricksCompletionFormat("m")
    assert not fmt.lists_prompt(job)
    body = fmt.response([job], [[generation()]], [None])
    assert body["choices"] == [{"index": 0, "text": "SayHello", "finish_reason": "stop"}]
    assert list(chunks(fmt, job)[-1]["choices"][0]) == ["index", "text", "finish_reason"]


def test_a_beam_search_stream_is_one_chunk_of_whole_choices():
    stream = Stream(ChatFormat("m"), [Job(messages=[], n=2)], [None])
    chunk = stream.whole([[generation(), generation()]])
    assert chunk["object"] == "chat.completion.chunk" and [c["index"] for c in chunk["choices"]] == [0, 1]
    assert "delta" in chunk["choices"][0] and "message" not in chunk["choices"][0]
    assert chunk["usage"]["completion_tokens"] == 6
