"""Prompt tables (`prompt_embedding_table`, `prompt_vocab_size`): ids >= the vocab size select table
rows, through the engine's embedding-row path. Fidelity against transformers' generate(inputs_embeds),
the prefix cache never confusing two tables with the same ids, validation, and through tritonserver."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from engine_helpers import fp32_runner
from transformers import AutoModelForCausalLM

from client.stream import StreamClient
from tritonlm.engine.loop import Engine
from tritonlm.engine.sequence import Sequence
from tritonlm.errors import InvalidRequest
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.text.tokenization import encode_prompt, load_tokenizer
from tritonlm.worker.model_runner import ModelRunner

VOCAB = 4096
HIDDEN = 256


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def runner(attention_backend, model_dir) -> ModelRunner:
    return fp32_runner(model_dir, attention_backend, max_num_seqs=4, max_seq_len=128)


def make_table(rows: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, rows, HIDDEN, generator=gen).to(torch.float16).numpy()


def request_tensors(ids: list[int], new: int, table: np.ndarray | None = None, **extra) -> dict:
    tensors = {
        "input_ids": np.array([ids], np.int32),
        "request_output_len": np.array([[new]], np.int32),
        **{k: np.asarray(v) for k, v in extra.items()},
    }
    if table is not None:
        tensors["prompt_embedding_table"] = table
    return tensors


def reference(hf_model, ids: list[int], table: np.ndarray, new: int) -> list[int]:
    """transformers' greedy generate on input embeddings built by the same substitution."""
    embeddings = hf_model.get_input_embeddings().weight.detach()
    rows = torch.from_numpy(table[0]).float()
    embeds = torch.stack([rows[i - VOCAB] if i >= VOCAB else embeddings[i] for i in ids])[None]
    with torch.no_grad():
        out = hf_model.generate(
            inputs_embeds=embeds,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
        )
    return out[0].tolist()[-new:]


def run(engine: Engine, tensors: list[dict]) -> list[Sequence]:
    seqs = [engine.add(parse_request(t, VOCAB, 128, hidden_size=HIDDEN)) for t in tensors]
    while engine.scheduler.has_work():
        engine.step()
    return seqs


def test_table_rows_replace_ids_beyond_the_vocabulary(runner, hf_model):
    table = make_table(6, 1)
    # Virtual tokens first (p-tuning), then text; a table id also in the middle, across a block edge.
    ids = [VOCAB, VOCAB + 1, VOCAB + 2, 17, 250, 31, 9, 1000, 77, 12, 55, 60, 70, 80, 90, VOCAB + 5, 33, 44]
    (seq,) = run(Engine(runner, lambda s, n: None), [request_tensors(ids, 10, table)])
    assert seq.output_ids == reference(hf_model, ids, table, 10)


def test_two_tables_with_the_same_ids_never_share_cached_blocks(runner, hf_model):
    engine = Engine(runner, lambda s, n: None)
    ids = [VOCAB + i for i in range(20)] + [101, 102, 103, 104, 105]  # the table spans a full block
    first, second = make_table(20, 2), make_table(20, 3)
    (a,) = run(engine, [request_tensors(ids, 8, first)])
    (b,) = run(engine, [request_tensors(ids, 8, second)])
    (c,) = run(engine, [request_tensors(ids, 8, first.copy())])
    assert a.out.cached_tokens == 0 and b.out.cached_tokens == 0  # same ids, other rows: no reuse
    assert c.out.cached_tokens == 16  # same rows: the full block is reused
    assert a.output_ids == c.output_ids == reference(hf_model, ids, first, 8)
    assert b.output_ids == reference(hf_model, ids, second, 8)


@pytest.mark.parametrize(
    "ids, table, extra, name",
    [
        ([1, VOCAB], None, {}, "input_ids"),  # no table: ids must be tokens
        ([1, VOCAB + 4], make_table(4, 0), {}, "input_ids"),  # beyond the table
        ([1, VOCAB + 2], make_table(4, 0), {"prompt_vocab_size": [2]}, "input_ids"),
        ([1, VOCAB], make_table(4, 0), {"prompt_vocab_size": [5]}, "prompt_vocab_size"),
        ([1, 2], None, {"prompt_vocab_size": [5]}, "prompt_vocab_size"),
        ([1, VOCAB], np.zeros((4, HIDDEN), np.float16), {}, "prompt_embedding_table"),
        ([1, VOCAB], np.zeros((1, 4, 12), np.float16), {}, "prompt_embedding_table"),
        ([1, VOCAB], np.full((1, 4, HIDDEN), np.inf, np.float16), {}, "prompt_embedding_table"),
        (
            [1, VOCAB],
            make_table(4, 0),
            {"return_log_probs": [True], "return_prompt_log_probs": [True]},
            "return_prompt_log_probs",
        ),
    ],
)
def test_bad_tables_are_named(ids, table, extra, name):
    with pytest.raises(InvalidRequest, match=name):
        parse_request(request_tensors(ids, 4, table, **extra), VOCAB, 128, hidden_size=HIDDEN)


def test_prompt_table_through_tritonserver(servers, hf_model):
    table = make_table(5, 4)
    ids = [VOCAB, VOCAB + 1, VOCAB + 2, VOCAB + 3, VOCAB + 4, 40, 41, 42]
    client = StreamClient(servers.grpc_url)
    try:
        values = {"input_ids": ids, "request_output_len": 8, "prompt_embedding_table": table}
        (response,) = list(client.generate("engine", values))
        assert response["output_ids"].tolist() == [reference(hf_model, ids, table, 8)]
        # The ensemble (text in): `virtual_tokens` puts the table's first rows before the prompt.
        text = {
            "text_input": ["Hello"],
            "max_tokens": 6,
            "virtual_tokens": 5,
            "prompt_embedding_table": table,
        }
        (response,) = list(client.generate("ensemble", text))
        hello = encode_prompt(load_tokenizer(servers.model_dir), "Hello")
        expected = reference(hf_model, [VOCAB + i for i in range(5)] + hello, table, 6)
        assert response["output_ids"].tolist() == [expected]
        with pytest.raises(RuntimeError, match="input_ids"):
            list(client.generate("engine", {**values, "prompt_vocab_size": 2}))
    finally:
        client.close()


# OpenAI /v1/completions `prompt_embeds` (vLLM's): the same rows, as a base64 torch.save'd tensor.


def embeds_b64(value: object) -> str:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def complete(servers, **body) -> httpx.Response:
    body = {"model": servers.model_name, "max_tokens": 6, "temperature": 0, **body}
    return httpx.post(servers.frontend_url + "/v1/completions", json=body, timeout=60)


def test_prompt_embeds_over_openai_completions(servers, hf_model):
    table = make_table(5, 4)  # the rows of test_prompt_table_through_tritonserver
    rows = torch.from_numpy(table[0]).float()  # float16 values: exact through any float dtype
    tokenizer = load_tokenizer(servers.model_dir)
    virtual = [VOCAB + i for i in range(5)]
    hello = encode_prompt(tokenizer, "Hello")

    def text(ids: list[int]) -> str:
        return tokenizer.decode(reference(hf_model, ids, table, 6), skip_special_tokens=True)

    # Embeddings alone: generate(inputs_embeds=rows).
    r = complete(servers, prompt_embeds=embeds_b64(rows))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == text(virtual)
    assert r.json()["usage"]["prompt_tokens"] == 5
    # With a prompt: the rows first, then the prompt's tokens (as the ensemble's virtual_tokens).
    r = complete(servers, prompt="Hello", prompt_embeds=embeds_b64(rows))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == text(virtual + hello)
    assert r.json()["usage"]["prompt_tokens"] == 5 + len(hello)
    # A list: one prompt each, answered as choices in order; bfloat16 accepted too.
    other = torch.from_numpy(make_table(3, 5)[0])
    r = complete(servers, prompt_embeds=[embeds_b64(other.bfloat16()), embeds_b64(rows)])
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[1]["text"] == text(virtual)
    assert r.json()["usage"]["prompt_tokens"] == 3 + 5
    # Streamed, and as an embedding layer's output [1, P, hidden].
    body = {"model": servers.model_name, "max_tokens": 6, "temperature": 0, "stream": True}
    body["prompt_embeds"] = embeds_b64(rows[None])
    with httpx.stream("POST", servers.frontend_url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert lines[-1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == text(virtual)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"prompt_embeds": "not base64!"}, "valid base64"),
        ({"prompt_embeds": base64.b64encode(b"not a tensor").decode()}, "torch.save"),
        ({"prompt_embeds": embeds_b64(Path("/etc/passwd"))}, "torch.save"),  # no arbitrary objects
        ({"prompt_embeds": embeds_b64({"rows": torch.zeros(2, HIDDEN)})}, "single tensor"),
        ({"prompt_embeds": embeds_b64(torch.zeros(2, HIDDEN, dtype=torch.int32))}, "float"),
        ({"prompt_embeds": embeds_b64(torch.zeros(2, 2, HIDDEN))}, "shape"),
        ({"prompt_embeds": embeds_b64(torch.full((2, HIDDEN), float("nan")))}, "finite"),
        ({"prompt_embeds": embeds_b64(torch.zeros(2, 12))}, "hidden size"),  # checked by the engine
        ({"prompt_embeds": []}, "base64"),
        ({"prompt_embeds": embeds_b64(torch.zeros(2, HIDDEN)), "echo": True}, "prompt_embeds"),
        ({"prompt_embeds": None}, "prompt_embeds"),
    ],
)
def test_bad_prompt_embeds_are_bad_requests(servers, body, message):
    r = complete(servers, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"]
    param = "echo" if "echo" in body else "prompt" if body["prompt_embeds"] is None else "prompt_embeds"
    assert error["param"] == param
