"""The OpenAI and Databricks routes without Triton: what reaches the models, response and stream
shapes, errors, fan-out and cancellation, against a fake Triton."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_frontend_unit import ENDLESS, FakeTriton, _run_asgi, events, request_inputs, response, sent_inputs

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.engine_client.triton import ENGINE, classify_error
from frontend.errors import APIError
from frontend.openai_api import prompt_embeds
from tritonlm import contract

MESSAGES = [{"role": "user", "content": "Hi"}]


def client(fake: FakeTriton, env: dict[str, str] | None = None, **settings):
    """A client of the app on `fake`, with these settings, else those of `env`, else the defaults."""
    from fastapi.testclient import TestClient

    config = replace(
        FrontendConfig.load([], env or {}), served_model_name="m", embed_model_name="e", **settings
    )
    return TestClient(create_app(config, triton=fake))


def chat(fake: FakeTriton, **body):
    return client(fake).post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body})


def completion(fake: FakeTriton, **body):
    return client(fake).post("/v1/completions", json={"model": "m", "prompt": "Hi", **body})


def values(inputs: dict[str, np.ndarray]) -> dict[str, object]:
    out = {}
    for name, array in inputs.items():
        items = [v.decode() if isinstance(v, bytes) else v.item() for v in array.reshape(-1)]
        out[name] = items[0] if array.size == 1 and name not in ("stop_words", "stop_token_ids") else items
    return out


class SeededFake(FakeTriton):
    """Each request's sequence depends on its random_seed (its cum_log_prob is -seed)."""

    async def stream(self, model, inputs, outputs=None):
        self.calls.append((model, inputs))
        seed = int(inputs["random_seed"][0]) if "random_seed" in inputs else 0
        out = response([(seed, f"s{seed}", -1.0, False)], finish="length")
        out["cum_log_probs"] = np.array([[-float(seed)]], dtype=np.float32)
        yield out


# ---------------------------------------------------------------------------------------------
# Errors: OpenAI's shape and statuses on /v1 and /serving-endpoints; TGI's elsewhere.


def test_validation_errors_are_400_in_openai_shape_and_tgi_keeps_422():
    fake = FakeTriton()
    r = chat(fake, temperature=3)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "temperature: must be a number in [0.0, 2.0], got 3",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
    }
    r = client(fake).post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert client(fake).get("/v1/nothing").json()["error"]["type"] == "invalid_request_error"
    r = client(fake).post("/", json={"inputs": "Hi", "parameters": {"top_k": 0}})
    assert r.status_code == 422 and r.json()["error_type"] == "validation"
    assert not fake.calls


def test_model_errors_before_the_first_token_get_a_status():
    error = APIError(
        *classify_error("in ensemble 'ensemble', [invalid argument] request_output_len: too big")
    )
    for stream in (False, True):
        r = completion(FakeTriton(error=error), stream=stream, max_tokens=9)
        assert r.status_code == 400
        assert r.json()["error"] == {
            "message": "max_tokens: too big",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": None,
        }


def test_errors_after_the_stream_started_are_an_event_then_done():
    fake = FakeTriton(error=APIError(500, "inference failed: engine died"), error_after=1)
    r = chat(fake, stream=True)
    assert r.status_code == 200
    chunks = [c for c in r.text.split("\n\n") if c]
    assert chunks[-1] == "data: [DONE]"
    assert json.loads(chunks[-2].removeprefix("data: ")) == {
        "error": {
            "message": "inference failed: engine died",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }


# ---------------------------------------------------------------------------------------------
# What reaches preprocessing and the engine.


def test_greedy_chat_inputs():
    fake = FakeTriton()
    r = chat(fake, temperature=0, max_tokens=5, chat_template_kwargs={"enable_thinking": False})
    assert r.status_code == 200, r.text
    sent = values(sent_inputs(fake))
    assert sent == {
        "chat_messages": json.dumps(MESSAGES),
        "chat_template_kwargs": json.dumps({"enable_thinking": False}),
        "max_tokens": 5,
        "streaming": False,
        "temperature": 0.0,
    }


def test_sampling_and_stop_inputs():
    fake = FakeTriton()
    body = {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "seed": 3,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "stop": "END",
        "stop_token_ids": [5, 6],
        "ignore_eos": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "min_tokens": 2,
        "logprobs": 3,
        "echo": True,
    }
    assert completion(fake, **body).status_code == 200
    sent = values(sent_inputs(fake))
    assert sent["temperature"] == 0.5 and sent["runtime_top_p"] == pytest.approx(0.9)
    assert sent["runtime_top_k"] == 7
    assert sent["random_seed"] == 3 and sent["min_length"] == 2
    assert sent["presence_penalty"] == 0.5 and sent["frequency_penalty"] == -0.5
    assert sent["repetition_penalty"] == pytest.approx(1.1)
    assert sent["stop_words"] == ["END"] and sent["stop_token_ids"] == [5, 6]
    assert sent["ignore_eos"] is True and sent["skip_special_tokens"] is False
    assert sent["include_stop_str_in_output"] is True
    assert sent["return_log_probs"] is True and sent["num_top_log_probs"] == 3
    assert sent["return_prompt_log_probs"] is True  # echo with logprobs lists the prompt's too
    assert sent["text_input"] == "Hi" and "max_tokens" not in sent  # absent: fill the context


def test_n_fans_out_with_consecutive_seeds():
    fake = SeededFake()
    body = completion(fake, n=3, seed=10, temperature=1).json()
    assert [values(i)["random_seed"] for i in request_inputs(fake)] == [10, 11, 12]
    assert [c["text"] for c in body["choices"]] == ["s10", "s11", "s12"]
    assert body["usage"]["completion_tokens"] == 3


def test_best_of_keeps_the_most_likely():
    fake = SeededFake()
    body = completion(fake, n=2, best_of=4, seed=1).json()
    assert len(request_inputs(fake)) == 4
    assert all(values(i)["return_log_probs"] is True for i in request_inputs(fake))
    assert [c["text"] for c in body["choices"]] == ["s1", "s2"]  # cum_log_prob -seed: lowest seeds win
    assert body["choices"][0]["logprobs"] is None


def _beams() -> dict[str, np.ndarray]:
    out = response([(7, "a", -0.5, False), (8, "b", -0.5, False)], finish="length")
    out["output_ids"] = np.array([[7, 8], [9, 0]], dtype=np.int32)
    out["sequence_length"] = np.array([2, 1], dtype=np.int32)
    out["text_output"] = np.array([b"ab", b"c"], dtype=object)
    out["token_texts"] = np.array([b"a", b"b", b"c"], dtype=object)
    out["finish_reason"] = np.array([b"length", b"end_id"], dtype=object)
    out["output_log_probs"] = np.array([[[-0.5, -0.5], [-0.1, 0.0]]], dtype=np.float32)
    return out


def test_beam_search():
    fake = FakeTriton([_beams()])
    body = completion(fake, use_beam_search=True, n=2, logprobs=0, max_tokens=2).json()
    sent = values(sent_inputs(fake))
    assert sent["beam_width"] == 2 and sent["streaming"] is False
    assert not {"temperature", "runtime_top_p", "runtime_top_k", "random_seed"} & set(sent)
    assert [(c["text"], c["finish_reason"]) for c in body["choices"]] == [("ab", "length"), ("c", "stop")]
    assert body["choices"][1]["logprobs"]["tokens"] == ["c"]
    assert body["usage"]["completion_tokens"] == 3
    # Streamed: one chunk with both choices, then [DONE].
    r = completion(FakeTriton([_beams()]), use_beam_search=True, n=2, stream=True)
    [chunk] = events(r.text.replace("data: [DONE]\n\n", ""))
    assert [c["index"] for c in chunk["choices"]] == [0, 1] and chunk["usage"]["completion_tokens"] == 3
    for patch in ({"temperature": 0.5}, {"stop": "x"}, {"top_k": 3}):
        assert completion(FakeTriton(), use_beam_search=True, **patch).status_code == 400


# ---------------------------------------------------------------------------------------------
# Response and stream shapes.


def test_chat_response_and_usage_extras():
    responses = [
        {**response([(10, "Hello", -0.5, False)]), "batch_size": np.array([1], np.int32),
         "queue_wait_us": np.array([40], np.int64), "decode_ms": np.array([9.6], np.float32),
         "prefill_ms": np.array([9.4], np.float32), "cached_tokens": np.array([2], np.int32)},
        {**response([(11, "!", -0.25, False)], finish="stop_words"), "batch_size": np.array([2], np.int32),
         "queue_wait_us": np.array([7], np.int64), "decode_ms": np.array([3.2], np.float32)},
    ]  # fmt: skip
    body = chat(FakeTriton(responses)).json()
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!", "tool_calls": []},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens": 2,
        "total_tokens": 6,
        "batch_size": [1, 2],
        "queue_wait_time": [40, 7],
    }
    assert body["prefill_time"] == 9 and body["decode_time_arr"] == [3]


def test_stream_with_two_choices():
    r = chat(FakeTriton(), stream=True, n=2)
    chunks = events(r.text.replace("data: [DONE]\n\n", ""))
    assert r.text.endswith("data: [DONE]\n\n")
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["delta"]["content"] for c in mine) == "Hello, world"
        assert [c["finish_reason"] for c in mine] == [None, None, "stop"]
    assert ["usage" in c for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    r = chat(FakeTriton(), stream=True, stream_options={"include_usage": False})
    assert all("usage" not in c for c in events(r.text.replace("data: [DONE]\n\n", "")))


def test_full_text_stream_setting():
    r = client(FakeTriton(), stream_full_text=True).post(
        "/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}
    )
    chunks = events(r.text.replace("data: [DONE]\n\n", ""))
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["Hello", "Hello, world", "Hello, world"]
    assert chunks[-1]["full_text"] == "Hello, world" and "full_text" not in chunks[0]
    r = client(FakeTriton(), env={"TRITONLM_STREAM_FULL_TEXT": "1"}).post(
        "/v1/completions", json={"model": "m", "prompt": "Hi", "stream": True}
    )
    assert events(r.text.replace("data: [DONE]\n\n", ""))[-1]["full_text"] == "Hello, world"


def test_completion_logprobs_and_echo():
    r = completion(FakeTriton(), logprobs=0, echo=True, suffix="!")
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"  # Databricks' only
    body = completion(FakeTriton(), logprobs=0).json()
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == ["Hello", ",", " world", ""]
    assert lp["text_offset"] == [0, 5, 6, 12]
    assert lp["token_logprobs"] == [-0.5, -0.25, -1.0, pytest.approx(-0.1)]
    assert lp["top_logprobs"][0] == {"Hello": -0.5}
    fake = FakeTriton()
    body = completion(fake, logprobs=0, echo=True).json()
    assert body["choices"][0]["text"] == "HiHello, world"
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"][:2] == ["<s>", "Hi"] and lp["token_logprobs"][0] is None  # the prompt's, first
    assert lp["text_offset"][:3] == [0, 3, 5]


# ---------------------------------------------------------------------------------------------
# Model names, Databricks dispatch.


def test_model_names():
    r = chat(FakeTriton(), model="other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert chat(FakeTriton(), model="e").status_code == 400  # the embedding model


def test_databricks_tasks(monkeypatch):
    fake = FakeTriton()
    c = client(fake)
    body = c.post("/serving-endpoints/m/invocations", json={"messages": MESSAGES}).json()
    assert body["object"] == "chat.completions" and set(body["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
    }
    body = c.post("/serving-endpoints/m/invocations", json={"prompt": ["a", "b"], "suffix": "."}).json()
    assert [ch["text"] for ch in body["choices"]] == ["Hello, world."] * 2
    assert body["usage"]["prompt_tokens"] == 8
    sent = c.post(
        "/serving-endpoints/completions", json={"model": "m", "prompt": "a", "error_behavior": "truncate"}
    )
    assert sent.status_code == 200 and values(sent_inputs(fake))["truncate_to_fit"] is True
    assert c.post("/serving-endpoints/x/invocations", json={"prompt": "a"}).status_code == 404

    async def fake_embeddings(request, name, body):
        return {"embedded": name, "input": body["input"]}

    import frontend.embeddings.routes

    monkeypatch.setattr(frontend.embeddings.routes, "embeddings_invocation", fake_embeddings)
    r = c.post("/serving-endpoints/e/invocations", json={"input": "x"})
    assert r.json() == {"embedded": "e", "input": "x"}


# ---------------------------------------------------------------------------------------------
# Disconnects cancel every Triton request of a fanned-out stream.


class CountingFake(FakeTriton):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.finished = 0

    async def stream(self, model, inputs, outputs=None):
        try:
            async for out in super().stream(model, inputs, outputs):
                yield out
        finally:
            self.finished += 1


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels_every_sequence(stream):
    async def scenario():
        fake = CountingFake(ENDLESS, delay=0.01)
        body = {"model": "m", "messages": MESSAGES, "stream": stream, "n": 2}
        app = create_app(FrontendConfig(served_model_name="m"), triton=fake)
        await _run_asgi_at(app, "/v1/chat/completions", body, 3 if stream else None)
        await asyncio.sleep(0.1)
        started = len([call for call in fake.calls if call[0] == ENGINE])
        assert fake.finished == started and not fake.completed
        assert started == 2

    asyncio.run(scenario())


async def _run_asgi_at(app, path: str, body: dict, chunks: int | None) -> list[dict]:
    async def routed(scope, receive, send):
        await app({**scope, "path": path, "raw_path": path.encode()}, receive, send)

    return await _run_asgi(routed, body, chunks)


# ---------------------------------------------------------------------------------------------
# The engine client: preprocessing, then the engine's stream, each fed by the contract's names.


class StepsFake:
    """Preprocessing, the encoder and the engine as a recording fake."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.engine_closed = False

    async def infer(self, model, inputs):
        self.calls.append((model, inputs))
        if model == "preprocessing":
            return {
                "input_ids": np.array([[5, 6]], np.int32),
                "out_end_id": np.array([1], np.int32),
                "request_output_len": np.array([[3]], np.int32),
                "input_token_texts": np.array([b"a", b"b"], dtype=object),
            }
        table = np.ones((1, 3, 2), np.float32)  # the encoder: the client's row, then the media's
        return {"prompt_embedding_table": table, "media_rows": np.array([[2]], np.int32)}

    async def stream(self, model, inputs, outputs=None):
        self.calls.append((model, inputs, outputs))
        try:
            for i in range(3):
                yield {"output_ids": np.array([[i]], np.int32), "request_key": np.array([9], np.uint64)}
        finally:
            self.engine_closed = True

    async def ready(self, models):
        return True


async def _first_response(job, outputs):
    from frontend.engine_client.client import EngineClient

    fake = StepsFake()
    stream = EngineClient(fake).stream(job, 0, outputs)
    first = await anext(stream)
    await stream.aclose()
    return fake, first


def test_the_engine_client_feeds_preprocessing_then_the_engine():
    from frontend.engine_client.request import Job
    from frontend.engine_client.steps import step_outputs

    job = Job(prompt="Hi", top_k=4, stream=True)
    fake, first = asyncio.run(_first_response(job, step_outputs(False)))
    (m1, pre), (m2, engine, asked) = fake.calls  # no postprocessing: the engine makes the text
    assert (m1, m2) == ("preprocessing", "engine")
    assert set(pre) == {"text_input"}
    assert engine["runtime_top_k"].tolist() == [4] and engine["streaming"].tolist() == [True]
    assert engine["end_id"].tolist() == [1] and engine["input_ids"].tolist() == [[5, 6]]
    assert "input_token_texts" not in engine and "top_k" not in engine
    assert "text_output" in asked and "output_log_probs" not in asked and "request_key" not in asked
    assert first["output_ids"].tolist() == [[0]]
    assert fake.engine_closed  # leaving early closes (so cancels) the engine's stream
    # Only the outputs asked for: with log probs, their texts too (contract.TEXT_OUTPUTS).
    fake, _ = asyncio.run(_first_response(job, step_outputs(True)))
    assert {"output_log_probs", "token_texts", "top_token_texts"} <= set(fake.calls[1][2])


def test_every_model_gets_the_inputs_the_contract_declares_by_name():
    from frontend.engine_client.client import model_inputs, passed_on
    from frontend.engine_client.request import Job, MediaItem

    job = Job(prompt="Hi", max_tokens=3, stop=["x"], top_k=2, logprobs=1, prompt_embeds=np.zeros((1, 2)))
    job.media = (MediaItem("image", b"png", "messages[0].content[1]"),)
    values = job.values()
    for model, tensors in (
        ("preprocessing", contract.PREPROCESSING_INPUTS),
        ("multimodal_encoder", contract.ENCODER_INPUTS),
        ("engine", contract.ENGINE_INPUTS),
    ):
        declared = {t.name: t for t in tensors}
        fed = model_inputs(model, values)
        assert set(fed) == set(values) & set(declared), model
        for name, array in fed.items():
            assert array.dtype == contract.NUMPY_DTYPES[declared[name].dtype], (model, name)
    assert values.keys() <= {
        t.name for t in contract.PREPROCESSING_INPUTS + contract.ENCODER_INPUTS + contract.ENGINE_INPUTS
    }
    assert model_inputs("multimodal_encoder", values)["media"].tolist() == [[b"png"]]
    assert model_inputs("engine", values)["prompt_embedding_table"].shape == (1, 1, 2)
    # Outputs feed the next model's inputs of the same name (out_ dropped); undeclared ones never.
    made = {"out_end_id": np.array([1]), "input_token_texts": np.array([b"a"]), "stray": np.array([0])}
    assert set(passed_on("preprocessing", made)) == {"end_id", "input_token_texts"}
    assert set(model_inputs("engine", {}, passed_on("preprocessing", made))) == {"end_id"}


def test_media_go_through_the_encoder_whose_table_replaces_the_clients():
    from frontend.engine_client.request import Job, MediaItem

    job = Job(prompt_parts=[{"type": "image"}], prompt_embeds=np.zeros((1, 2)), sample=False)
    job.media = (MediaItem("image", b"png", "inputs[0]"),)
    fake, _ = asyncio.run(_first_response(job, ("text_output",)))
    (m0, enc), (m1, pre), (m2, engine, _) = fake.calls
    assert (m0, m1, m2) == ("multimodal_encoder", "preprocessing", "engine")
    assert set(enc) == {"media", "media_kinds", "prompt_embedding_table", "virtual_tokens"}
    assert pre["media_rows"].tolist() == [[2]] and pre["virtual_tokens"].tolist() == [1]
    assert engine["prompt_embedding_table"].shape == (1, 3, 2)  # the encoder's, not the client's


def test_prompt_embeds_decoding_is_bounded_and_safe(monkeypatch, tmp_path):
    def b64(value: object) -> str:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return base64.b64encode(buffer.getvalue()).decode()

    class Evil:  # unpickling it would create a file
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    with pytest.raises(prompt_embeds.BadEmbeds, match="torch.save"):
        prompt_embeds.decode_all(base64.b64encode(pickle.dumps(Evil(), protocol=2)).decode())
    with pytest.raises(prompt_embeds.BadEmbeds, match="torch.save"):
        prompt_embeds.decode_all(b64({"x": Evil()}))
    assert not (tmp_path / "pwned").exists()
    (rows,) = prompt_embeds.decode_all(b64(torch.ones(1, 3, 8)))  # an embedding layer's output
    assert rows.shape == (3, 8) and rows.dtype == np.float32
    # An expanded tensor's payload is small, its values are not: bounded by the count of values.
    monkeypatch.setattr(prompt_embeds, "MAX_EMBEDS_BYTES", 4096)
    with pytest.raises(prompt_embeds.BadEmbeds, match="at most 1024 values"):
        prompt_embeds.decode_all(b64(torch.ones(1, 8).expand(1000, 8)))
    with pytest.raises(prompt_embeds.BadEmbeds, match="at most 4096 bytes"):
        prompt_embeds.decode_all(b64(torch.ones(2000, 8)))
    with pytest.raises(prompt_embeds.BadEmbeds, match="float16, bfloat16, float32 or float64"):
        prompt_embeds.decode_all(b64(torch.ones(2, 8).to(torch.float8_e4m3fn)))
    with pytest.raises(prompt_embeds.BadEmbeds, match="dense"):
        prompt_embeds.decode_all(b64(torch.eye(4).to_sparse()))
