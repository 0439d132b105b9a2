"""NVIDIA's names on a real tritonserver: TensorRT-LLM's LLM-API model (`tensorrt_llm`) and the
tensors Triton's OpenAI frontend sends (`tensorrt_llm_bls`: the ensemble's, batched; the ensemble:
the same names unbatched), over gRPC and Triton's generate endpoint, each equal to the same request
in our own names on the ensemble."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from client.stream import StreamClient

PROMPT = "What is machine learning?"


def generate(servers, model: str, body: dict, route: str = "generate") -> httpx.Response:
    url = f"http://127.0.0.1:{servers.ports.http}/v2/models/{model}/{route}"
    return httpx.post(url, json=body, timeout=120)


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def grpc(servers, model: str, arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """One request on a gRPC stream, its tensors exactly as given; every response's outputs."""
    client = StreamClient(servers.grpc_url)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        client.client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = client.responses.get(timeout=120)
            if error is not None:
                raise RuntimeError(error.message())
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.close()


def text(array: np.ndarray) -> str:
    (value,) = array.reshape(-1)
    return value.decode()


def ours(servers, body: dict) -> dict:
    """The same request in our names, on the ensemble."""
    return ok(generate(servers, "ensemble", body))


# ---------------------------------------------------------------------------------------------
# tensorrt_llm: TensorRT-LLM's LLM-API model


def test_llm_api_greedy_text_equals_ours_over_grpc_and_generate(servers):
    expected = ours(servers, {"text_input": PROMPT, "max_tokens": 12})["text_output"]
    body = {
        "text_input": PROMPT,
        "sampling_param_max_tokens": 12,
        "sampling_param_exclude_input_from_output": True,
    }
    assert ok(generate(servers, "tensorrt_llm", body))["text_output"] == expected
    arrays = {
        "text_input": np.array([PROMPT.encode()], object),
        "sampling_param_max_tokens": np.array([12], np.int32),
        "sampling_param_exclude_input_from_output": np.array([True]),
    }
    (response,) = grpc(servers, "tensorrt_llm", arrays)
    assert text(response["text_output"]) == expected
    assert set(response) == {"text_output"}  # nothing else unless a return_* input asks


def test_llm_api_requests_overlap(servers):
    """Each request runs on a thread of its own: concurrent streams each get their own text."""
    prompts = ["Hello", "Tell me a story", "What is machine learning?", "🎉 party"]
    expected = [ours(servers, {"text_input": p, "max_tokens": 12})["text_output"] for p in prompts]

    def run(prompt: str) -> str:
        body = {"text_input": prompt, "sampling_param_max_tokens": 12, "streaming": True}
        streamed = events(generate(servers, "tensorrt_llm", body, "generate_stream"))
        return streamed[-1]["text_output"]

    with ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(run, prompts)) == expected


def test_llm_api_defaults_are_tensorrt_llms(servers):
    """Without sampling_param_max_tokens: SamplingParams' 32 tokens; without
    sampling_param_exclude_input_from_output: the Triton model's false, the prompt first."""
    expected = ours(servers, {"text_input": PROMPT, "max_tokens": 32, "exclude_input_in_output": False})
    assert expected["text_output"].startswith(PROMPT)
    assert (
        ok(generate(servers, "tensorrt_llm", {"text_input": PROMPT}))["text_output"]
        == expected["text_output"]
    )


def test_llm_api_sampling_equals_ours(servers):
    theirs = {
        "text_input": "Hello",
        "sampling_param_max_tokens": 10,
        "sampling_param_temperature": 0.8,
        "sampling_param_top_p": 0.9,
        "sampling_param_top_k": 20,
        "sampling_param_seed": 5,
        "sampling_param_frequency_penalty": 0.3,
        "sampling_param_presence_penalty": 0.2,
        "sampling_param_exclude_input_from_output": True,
        "return_finish_reason": True,
        "return_cumulative_logprob": True,
    }
    mine = {
        "text_input": "Hello",
        "max_tokens": 10,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 20,
        "random_seed": 5,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "return_log_probs": True,
    }
    got, expected = ok(generate(servers, "tensorrt_llm", theirs)), ours(servers, mine)
    assert got["text_output"] == expected["text_output"]
    assert got["cumulative_logprob"] == pytest.approx(expected["cum_log_probs"])
    assert got["finish_reason"] == {"length": "length", "end_id": "stop"}[expected["finish_reason"]]


def test_llm_api_stop_strings_and_reasons(servers):
    free = ours(servers, {"text_input": PROMPT, "max_tokens": 20})["text_output"]
    stop = free[4:7]
    body = {
        "text_input": PROMPT,
        "sampling_param_max_tokens": 20,
        "sampling_param_stop": [stop],
        "sampling_param_exclude_input_from_output": True,
        "return_finish_reason": True,
        "return_stop_reason": True,
    }
    got = ok(generate(servers, "tensorrt_llm", body))
    assert got["text_output"] == free[: free.index(stop)]
    assert (got["finish_reason"], got["stop_reason"]) == ("stop", stop)


def test_llm_api_streams_the_whole_text_so_far(servers):
    body = {
        "text_input": PROMPT,
        "sampling_param_max_tokens": 12,
        "sampling_param_exclude_input_from_output": True,
        "return_finish_reason": True,
    }
    whole = ok(generate(servers, "tensorrt_llm", body))["text_output"]
    streamed = events(generate(servers, "tensorrt_llm", {**body, "streaming": True}, "generate_stream"))
    assert len(streamed) > 1
    texts = [e["text_output"] for e in streamed]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    assert texts[-1] == whole
    assert [e["finish_reason"] for e in streamed] == ["None"] * (len(streamed) - 1) + ["length"]
    arrays = {
        "text_input": np.array([PROMPT.encode()], object),
        "streaming": np.array([True]),
        "sampling_param_max_tokens": np.array([12], np.int32),
        "sampling_param_exclude_input_from_output": np.array([True]),
    }
    assert text(grpc(servers, "tensorrt_llm", arrays)[-1]["text_output"]) == whole


def test_llm_api_perf_metrics(servers):
    prompt = "The prefix cache keeps whole blocks of a prompt it has seen before. " * 3
    body = {"text_input": prompt, "sampling_param_max_tokens": 2, "sampling_param_return_perf_metrics": True}
    ok(generate(servers, "tensorrt_llm", body))
    again = ok(generate(servers, "tensorrt_llm", body))  # the same prompt: its whole blocks reused
    assert again["kv_cache_reused_block"] > 0 and 0 < again["kv_cache_hit_rate"] <= 1
    assert again["kv_cache_alloc_total_blocks"] >= again["kv_cache_reused_block"]
    assert again["arrival_time_ns"] <= again["first_token_time_ns"] <= again["last_token_time_ns"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("sampling_param_top_p", 2.0, "sampling_param_top_p must be in [0.0, 1.0], got 2.0"),
        ("sampling_param_max_tokens", 0, "sampling_param_max_tokens must be >= 1"),
        ("sampling_param_best_of", 2, "sampling_param_best_of: only 1 is served"),
        ("lora_path", "/adapters/sql", "lora_path: adapters are not loaded per request"),
    ],
)
def test_llm_api_bad_values_are_400_naming_the_tensor(servers, name, value, message):
    response = generate(servers, "tensorrt_llm", {"text_input": PROMPT, name: value})
    assert response.status_code == 400 and message in response.json()["error"], response.text


def test_llm_api_errors_over_grpc_name_the_tensor(servers):
    arrays = {
        "text_input": np.array([PROMPT.encode()], object),
        "sampling_param_top_p": np.array([2.0], np.float32),
    }
    with pytest.raises(RuntimeError, match=r"sampling_param_top_p must be in \[0.0, 1.0\]"):
        grpc(servers, "tensorrt_llm", arrays)
    # The ensemble's own checks come back in the LLM API's names too.
    too_long = {
        "text_input": np.array([PROMPT.encode()], object),
        "sampling_param_max_tokens": np.array([10**6], np.int32),
    }
    with pytest.raises(RuntimeError, match=r"sampling_param_max_tokens"):
        grpc(servers, "tensorrt_llm", too_long)


# ---------------------------------------------------------------------------------------------
# What Triton's OpenAI frontend sends (`--backend tensorrtllm`): tensorrt_llm_bls and the ensemble


def openai_frontend_request(stream: bool) -> dict[str, np.ndarray]:
    """The tensors `_create_trtllm_generate_request` builds for a completion with stop, top_p,
    temperature, penalties and seed: each [1, 1], stop_words [1, n]."""
    return {
        "text_input": np.array([[PROMPT.encode()]], object),
        "stream": np.array([[stream]]),
        "max_tokens": np.array([[10]], np.int32),
        "stop_words": np.array([["never said", "nor this"]], object),
        "top_p": np.array([[0.9]], np.float32),
        "frequency_penalty": np.array([[0.1]], np.float32),
        "presence_penalty": np.array([[0.1]], np.float32),
        "seed": np.array([[3]], np.uint64),
        "temperature": np.array([[0.7]], np.float32),
        "exclude_input_in_output": np.array([[True]]),
        "return_num_input_tokens": np.array([[True]]),
        "return_num_output_tokens": np.array([[True]]),
    }


def test_triton_openai_frontend_tensors_on_tensorrt_llm_bls(servers):
    mine = {
        "text_input": PROMPT,
        "max_tokens": 10,
        "stop_words": ["never said", "nor this"],
        "top_p": 0.9,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.1,
        "random_seed": 3,
        "temperature": 0.7,
    }
    expected = ours(servers, mine)
    responses = grpc(servers, "tensorrt_llm_bls", openai_frontend_request(stream=False))
    assert 1 <= len(responses) <= 2  # what the frontend accepts without streaming
    first = responses[0]
    assert text(first["text_output"]) == expected["text_output"]  # read as the frontend reads it
    assert first["num_input_tokens"].reshape(-1).tolist() == [expected["prompt_tokens"]]
    assert first["num_output_tokens"].reshape(-1).tolist() == [expected["sequence_length"]]
    streamed = grpc(servers, "tensorrt_llm_bls", openai_frontend_request(stream=True))
    assert "".join(text(r["text_output"]) for r in streamed) == expected["text_output"]
    assert sum(int(r["num_output_tokens"].sum()) for r in streamed) == expected["sequence_length"]


def test_the_ensemble_takes_the_same_names_unbatched(servers):
    unbatched = {name: value[0] for name, value in openai_frontend_request(stream=False).items()}
    (response,) = grpc(servers, "ensemble", unbatched)
    (batched, *_) = grpc(servers, "tensorrt_llm_bls", openai_frontend_request(stream=False))
    assert text(response["text_output"]) == text(batched["text_output"])


def test_tensorrt_llm_bls_over_generate(servers):
    body = {"text_input": PROMPT, "max_tokens": 8}
    expected = ours(servers, body)["text_output"]
    assert ok(generate(servers, "tensorrt_llm_bls", body))["text_output"] == expected
    streamed = events(generate(servers, "tensorrt_llm_bls", {**body, "stream": True}, "generate_stream"))
    assert "".join(e["text_output"] for e in streamed if "text_output" in e) == expected
    bad = generate(servers, "tensorrt_llm_bls", {**body, "top_p": 2.0})
    assert bad.status_code == 400 and "top_p" in bad.json()["error"]
