"""End to end: embeddings through the real tritonserver (the `embedding` model) and the frontend."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from tritonlm.embedding import config as embedding_config

pytestmark = pytest.mark.usefixtures("servers")

MODEL = embedding_config.DEFAULT_NAME
TEXTS = ["The cat sits on the mat.", "今天天气很好,我们去公园散步吧。"]


def reference(texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 computed here with transformers: each text alone, mean pooling, L2."""
    directory = embedding_config.default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        hidden = [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0] for t in texts]
    return np.stack([torch.nn.functional.normalize(h.mean(0), dim=0).numpy() for h in hidden])


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def post(servers, path: str, body: dict) -> httpx.Response:
    return httpx.post(servers.frontend_url + path, json=body, timeout=60)


def vectors(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def test_openai_client_matches_the_reference(servers):
    client = openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="unused")
    # The SDK asks for base64 by default and decodes it; float is asked for explicitly.
    default = client.embeddings.create(model=MODEL, input=TEXTS)
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float", dimensions=384)
    expected = reference(TEXTS)
    for result in (default, floats):
        got = np.array([d.embedding for d in result.data])
        assert got.shape == (2, 384) and result.model == MODEL
        assert np.all(cosine(got, expected) > 0.999)
        assert result.usage.prompt_tokens == result.usage.total_tokens > 4
    assert np.allclose([d.embedding for d in default.data], [d.embedding for d in floats.data], atol=1e-6)


def test_base64_is_little_endian_float32(servers):
    floats = post(servers, "/v1/embeddings", {"model": MODEL, "input": "hello"}).json()
    b64 = post(servers, "/v1/embeddings", {"model": MODEL, "input": "hello", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, vectors(floats)[0])


def test_databricks_invocation_shape_and_instruction(servers):
    path = f"/serving-endpoints/{MODEL}/invocations"
    response = post(servers, path, {"input": ["a query", "another"]})
    body = response.json()
    assert response.status_code == 200, body
    assert set(body) == {"id", "object", "model", "data", "usage"}
    assert body["object"] == "list" and body["model"] == MODEL and isinstance(body["id"], str)
    assert [(d["object"], d["index"], len(d["embedding"])) for d in body["data"]] == [
        ("embedding", 0, 384),
        ("embedding", 1, 384),
    ]
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens"}
    # The instruction is prepended with a space: the same vector as the joined text, another vector.
    instructed = vectors(post(servers, path, {"input": "a query", "instruction": "Search:"}).json())[0]
    joined = vectors(post(servers, path, {"input": "Search: a query"}).json())[0]
    assert cosine(instructed, joined) > 0.9999 and cosine(instructed, vectors(body)[0]) < 0.99


def stats(servers) -> tuple[int, int]:
    url = f"http://127.0.0.1:{servers.ports.http}/v2/models/embedding/stats"
    [model] = httpx.get(url, timeout=10).json()["model_stats"]
    return model["inference_count"], model["execution_count"]


def test_concurrent_requests_share_forward_passes(servers):
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'trains'}" for i in range(16)]
    inferences, executions = stats(servers)
    with ThreadPoolExecutor(len(texts)) as pool:
        bodies = list(pool.map(lambda t: post(servers, "/v1/embeddings", {"input": t}).json(), texts))
    alone = vectors(post(servers, "/v1/embeddings", {"input": texts}).json())
    after_inferences, after_executions = stats(servers)
    assert after_inferences - inferences == 2 * len(texts)  # one text per request, then all at once
    assert after_executions - executions < len(texts)  # some requests shared a forward pass
    assert np.all(cosine(np.concatenate([vectors(b) for b in bodies]), alone) > 0.9999)


def test_models_lists_both(servers):
    ids = [m["id"] for m in httpx.get(servers.frontend_url + "/v1/models").json()["data"]]
    assert ids == [servers.model_name, MODEL]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": []}, 400, "input"),
        ({"input": ""}, 400, "input"),
        ({"input": "x", "model": "tiny"}, 400, "model"),  # the generative model
        ({"input": "x", "model": "no-such-model"}, 404, "model"),
        ({"input": "x", "dimensions": 128}, 400, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ],
)
def test_errors_are_4xx_in_openai_shape(servers, body, status, param):
    response = post(servers, "/v1/embeddings", {"model": MODEL, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert param in error["message"] or body.get("model", "") in error["message"]


def test_openai_client_raises_on_wrong_model(servers):
    client = openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="text generation"):
        client.embeddings.create(model=servers.model_name, input="hi")
