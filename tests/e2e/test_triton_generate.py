"""Triton's own generate endpoint on the `ensemble`, as TensorRT-LLM's Triton backend users call it:
its quick-start body, streamed and not, the fields Triton's OpenAI frontend sends and reads, the
ensemble names of TensorRT-LLM that ours spell differently (contract aliases), and bad values
(400 naming the tensor). A plain HTTP client against a real tritonserver's HTTP port."""

from __future__ import annotations

import json

import httpx
import pytest

QUICK_START = {"text_input": "What is machine learning?", "max_tokens": 20, "bad_words": "", "stop_words": ""}
# What Triton's OpenAI frontend sends a TensorRT-LLM ensemble (besides sampling settings).
OPENAI_FRONTEND = {
    "text_input": "What is machine learning?",
    "max_tokens": 8,
    "exclude_input_in_output": True,
    "return_num_input_tokens": True,
    "return_num_output_tokens": True,
}
SAMPLED = {"temperature": 1.0, "top_p": 1.0}


def generate(servers, body: dict, route: str = "generate") -> httpx.Response:
    url = f"http://127.0.0.1:{servers.ports.http}/v2/models/ensemble/{route}"
    return httpx.post(url, json=body, timeout=60)


def events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def flat_ids(streamed: list[dict]) -> list[int]:
    """The token ids of a stream's events (an event of one token holds it alone, not in a list)."""
    ids = [e["output_ids"] for e in streamed]
    return [i for chunk in ids for i in (chunk if isinstance(chunk, list) else [chunk])]


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_quick_start_answers_with_text(servers):
    body = ok(generate(servers, QUICK_START))
    assert isinstance(body["text_output"], str) and body["text_output"]
    assert body["sequence_length"] == 20 or body["finish_reason"] != "length"


def test_quick_start_streamed_equals_the_whole_answer(servers):
    whole = ok(generate(servers, QUICK_START))["text_output"]
    streamed = events(generate(servers, {**QUICK_START, "stream": True}, "generate_stream"))
    assert len(streamed) > 1
    assert "".join(e["text_output"] for e in streamed) == whole
    assert streamed[-1]["finish_reason"] and not streamed[0]["finish_reason"]


def test_openai_frontend_fields_count_tokens(servers):
    body = ok(generate(servers, OPENAI_FRONTEND))
    assert body["num_input_tokens"] == body["prompt_tokens"] > 0
    assert body["num_output_tokens"] == body["sequence_length"] > 0
    streamed = events(generate(servers, {**OPENAI_FRONTEND, "stream": True}, "generate_stream"))
    assert all(e["num_input_tokens"] == body["num_input_tokens"] for e in streamed)
    assert sum(e["num_output_tokens"] for e in streamed) == body["num_output_tokens"]
    assert "".join(e["text_output"] for e in streamed) == body["text_output"]


def test_counts_are_empty_unless_asked(servers):
    body = ok(generate(servers, QUICK_START))
    assert body["num_input_tokens"] == [] and body["num_output_tokens"] == []
    assert body["kv_cache_reused_blocks"] == [] and body["arrival_time_ns"] == []


def test_perf_metrics(servers):
    prompt = "The prefix cache keeps whole blocks of a prompt it has seen before. " * 3
    request = {"text_input": prompt, "max_tokens": 4, "return_perf_metrics": True}
    ok(generate(servers, request))
    body = ok(generate(servers, request))  # the same prompt again: its full blocks are reused
    assert body["kv_cache_reused_blocks"] > 0
    assert (
        body["kv_cache_alloc_total_blocks"]
        == body["kv_cache_reused_blocks"] + body["kv_cache_alloc_new_blocks"]
    )
    assert (
        body["arrival_time_ns"]
        <= body["first_scheduled_time_ns"]
        <= body["first_token_time_ns"]
        <= body["last_token_time_ns"]
    )
    assert body["total_draft_tokens"] == 0 and body["acceptance_rate"] == 0.0


@pytest.mark.parametrize(
    ("trtllm", "ours", "value", "settings"),
    [("seed", "random_seed", 7, SAMPLED), ("min_tokens", "min_length", 6, {"random_seed": 3, **SAMPLED})],
)
def test_tensorrt_llm_names_are_ours(servers, trtllm, ours, value, settings):
    base = {"text_input": "Hello", "max_tokens": 8, "stop_words": ["e", "a", "o"], **settings}
    theirs = ok(generate(servers, {**base, trtllm: value}))
    mine = ok(generate(servers, {**base, ours: value}))
    assert theirs["output_ids"] == mine["output_ids"]
    both = generate(servers, {**base, trtllm: value, ours: value})
    assert both.status_code == 400 and trtllm in both.json()["error"] and ours in both.json()["error"]


def test_embedding_bias_words(servers):
    plain = ok(generate(servers, {"text_input": "Hello", "max_tokens": 4}))
    word = plain["token_texts"][1]
    body = {"text_input": "Hello", "max_tokens": 4, "embedding_bias_words": [word, ""]}
    biased = ok(generate(servers, {**body, "embedding_bias_weights": [1000.0, 1.0]}))
    assert biased["text_output"] == word * 4


def test_num_return_sequences_picks_the_best_beams(servers):
    body = {"text_input": "Hello", "max_tokens": 4, "beam_width": 3}
    beams = ok(generate(servers, body))
    best = ok(generate(servers, {**body, "num_return_sequences": 2}))
    assert best["text_output"] == beams["text_output"][:2]


def test_num_return_sequences_samples_that_many(servers):
    """TensorRT-LLM's num_return_sequences without beam search: k sampled sequences of one request,
    sequence i the single request of seed + i (as the HTTP APIs' `n`). Not streamed: one answer with
    a row of each; streamed: each sequence's responses, named by sequence_index."""
    body = {"text_input": "Hello", "max_tokens": 6, "seed": 11, **SAMPLED}
    rows = ok(generate(servers, {**body, "num_return_sequences": 3}))
    assert rows["sequence_index"] == [0, 1, 2] and len(rows["text_output"]) == 3
    width = len(rows["output_ids"]) // 3  # Triton's JSON flattens the [3, width] rows
    for i in range(3):
        alone = ok(generate(servers, {**body, "seed": 11 + i}))
        assert rows["text_output"][i] == alone["text_output"]
        row = rows["output_ids"][i * width : (i + 1) * width]
        assert row[: rows["sequence_length"][i]] == alone["output_ids"]
    streamed = events(
        generate(servers, {**body, "num_return_sequences": 3, "stream": True}, "generate_stream")
    )
    texts = ["", "", ""]
    for event in streamed:
        texts[event["sequence_index"]] += event["text_output"]
    assert texts == rows["text_output"]
    assert sum(1 for e in streamed if e["finish_reason"]) == 3


def test_exclude_input_in_output_false_starts_the_output_with_the_prompt(servers):
    """TensorRT-LLM's `exclude_input_in_output: false`: output_ids (so text_output) start with the
    prompt and sequence_length counts it; the log probs and num_output_tokens stay per generated
    token. Streamed, the responses hold their new tokens alone, as TensorRT-LLM's do."""
    asked = {**QUICK_START, "return_num_output_tokens": True, "return_log_probs": True}
    alone = ok(generate(servers, asked))
    echoed = ok(generate(servers, {**asked, "exclude_input_in_output": False}))
    prompt = echoed["prompt_tokens"]
    assert echoed["output_ids"][prompt:] == alone["output_ids"]
    assert echoed["sequence_length"] == prompt + alone["sequence_length"]
    assert echoed["text_output"] == QUICK_START["text_input"] + alone["text_output"]
    assert echoed["num_output_tokens"] == alone["num_output_tokens"] == alone["sequence_length"]
    assert echoed["output_log_probs"] == alone["output_log_probs"]
    streamed = {**QUICK_START, "stream": True}
    excluded = events(generate(servers, streamed, "generate_stream"))
    included = events(generate(servers, {**streamed, "exclude_input_in_output": False}, "generate_stream"))
    assert flat_ids(included) == flat_ids(excluded) == alone["output_ids"]
    assert "".join(e["text_output"] for e in included) == alone["text_output"]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("max_tokens", 0, "max_tokens"),
        ("top_p", 7.0, "runtime_top_p"),  # the engine's tensor that the ensemble's top_p feeds
        ("min_tokens", -2, "min_tokens"),
        ("num_return_sequences", 17, "num_return_sequences"),
        ("num_return_sequences", 0, "num_return_sequences"),
        ("embedding_bias_weights", [1.0, 2.0], "embedding_bias_weights"),
    ],
)
def test_bad_values_are_400_naming_the_tensor(servers, field, value, named):
    response = generate(servers, {**QUICK_START, field: value})
    assert response.status_code == 400, response.text
    assert named in response.json()["error"]
    streamed = generate(servers, {**QUICK_START, field: value, "stream": True}, "generate_stream")
    assert streamed.status_code == 400 and named in streamed.text


@pytest.mark.parametrize(("field", "value"), [("seed", -1), ("return_num_input_tokens", "yes")])
def test_json_of_the_wrong_type_is_refused_by_triton(servers, field, value):
    """Triton's HTTP server converts the JSON before any model sees it: a value of the wrong JSON
    type is its own error (a 500 in Triton 2.51), and the server goes on serving."""
    response = generate(servers, {**QUICK_START, field: value})
    assert response.status_code >= 400 and "Unable to parse" in response.json()["error"]
    assert ok(generate(servers, QUICK_START))["text_output"]
