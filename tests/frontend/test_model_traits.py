"""Each served model's own parsers and media (frontend.model_traits), without Triton: read from its
checkpoint by FrontendConfig.chat_parsers' rule, at start-up for each of MODEL_DIRS and when the admin
route loads one, and used by the routes for the model a request names (a fake Triton answers)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_frontend_unit import FakeTriton, response

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.engine_client.served import ModelTraits
from frontend.model_traits import read_traits

# A template that renders tools and knows <think> blocks; one that knows neither.
THINKER_TEMPLATE = "{% if tools %}<tool_call>{{ tools }}</tool_call>{% endif %}<think>{{ messages }}"
PLAIN_TEMPLATE = "{{ messages }}"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
IMAGE = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"png").decode()},
}


def checkpoint(root: Path, name: str, template: str, architecture: str) -> Path:
    path = root / name
    path.mkdir()
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return path


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    """A multimodal model with a tools-and-thinking template, and a text-only one with neither."""
    vision = checkpoint(tmp_path, "vision", THINKER_TEMPLATE, "LlavaForConditionalGeneration")
    plain = checkpoint(tmp_path, "plain", PLAIN_TEMPLATE, "LlamaForCausalLM")
    return vision, plain


def test_traits_come_from_each_checkpoint_and_the_settings_override_all(dirs):
    vision, plain = (str(d) for d in dirs)
    config = FrontendConfig()
    assert read_traits(config, vision) == ModelTraits("hermes", "think", False, ("image",))
    assert read_traits(config, plain) == ModelTraits("hermes", "none", True, ())
    assert read_traits(config, "") == ModelTraits()  # no checkpoint: text-only, the defaults
    assert read_traits(config, plain, ("audio",)).media_kinds == ("audio",)
    explicit = FrontendConfig(tool_parser="deepseek", reasoning_parser="think", tools_in_prompt=False)
    for model_dir in (vision, plain):
        traits = read_traits(explicit, model_dir)
        assert (traits.tool_parser, traits.reasoning_parser, traits.tools_in_prompt) == (
            "deepseek",
            "think",
            False,
        )
    with pytest.raises(ValueError, match="nope"):
        read_traits(FrontendConfig(tool_parser="nope"), vision)


def test_the_single_model_keeps_model_dirs_traits(dirs):
    vision, _ = dirs
    app = create_app(FrontendConfig(model_dir=str(vision), embed_model_name="e"), triton=FakeTriton())
    [model] = app.state.served_models.values()
    assert model.traits == read_traits(FrontendConfig(), str(vision))
    assert FrontendConfig(model_dir=str(vision)).chat_parsers() == ("hermes", "think", False)


def two_models(dirs, **settings) -> TestClient:
    vision, plain = dirs
    config = FrontendConfig(
        model_dirs=(f"vision={vision}", f"plain={plain}"), embed_model_name="e", **settings
    )
    thinking = [response([(5, "<think>hmm</think>Hi", -0.1, False)], finish="stop")]
    return TestClient(create_app(config, triton=FakeTriton(thinking)))


def chat(c: TestClient, model: str, content, **body):
    return c.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": content}], **body},
    )


def test_each_model_reads_replies_with_its_own_reasoning_parser(dirs):
    c = two_models(dirs)
    vision = chat(c, "vision", "hi").json()["choices"][0]["message"]
    assert (vision["reasoning_content"], vision["content"]) == ("hmm", "Hi")
    plain = chat(c, "plain", "hi").json()["choices"][0]["message"]
    assert plain["content"] == "<think>hmm</think>Hi" and not plain.get("reasoning_content")
    anthropic = c.post(
        "/v1/messages",
        json={"model": "plain", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert [block["type"] for block in anthropic.json()["content"]] == ["text"], anthropic.text
    r = c.post("/v1/responses", json={"model": "vision", "input": "hi"})
    assert [item["type"] for item in r.json()["output"]] == ["reasoning", "message"], r.text


def test_tools_go_into_the_prompt_only_for_the_model_whose_template_knows_none(dirs, jobs):
    c = two_models(dirs)
    for model in ("vision", "plain"):
        assert chat(c, model, "hi", tools=TOOLS).status_code == 200
    vision, plain = jobs
    assert vision.guide is None
    assert plain.guide is not None and plain.guide_param == "tools"


def test_media_follow_the_model_a_request_names(dirs, jobs):
    c = two_models(dirs)
    parts = [{"type": "text", "text": "what is it?"}, IMAGE]
    assert chat(c, "vision", parts).status_code == 200
    assert [item.kind for item in jobs[0].media] == ["image"]
    r = chat(c, "plain", parts)
    assert r.status_code == 400 and "text-only" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages[0].content[1]"
    r = c.post("/", json={"inputs": [{"type": "text", "text": "hi"}, IMAGE]})  # TGI: the default model
    assert r.status_code == 200, r.text


class LoadingTriton(FakeTriton):
    """Triton's explicit model control, as the admin load route calls it."""

    async def load(self, name: str) -> None:
        pass

    async def unload(self, name: str) -> None:
        pass


def test_a_model_loaded_at_run_time_reads_its_own_traits(dirs, tmp_path):
    vision, plain = dirs
    repository = tmp_path / "repository"
    repository.mkdir()
    config = FrontendConfig(
        model_dir=str(plain), embed_model_name="e", admin_api_key="k", model_repository=str(repository)
    )
    c = TestClient(create_app(config, triton=LoadingTriton()))
    headers = {"Authorization": "Bearer k"}
    r = c.post("/v1/models/seer/load", json={"model_dir": str(vision)}, headers=headers)
    assert r.status_code == 200, r.text
    assert c.app.state.served_models["seer"].traits == ModelTraits("hermes", "think", False, ("image",))
    assert c.app.state.served_models["plain"].traits.media_kinds == ()


def test_a_gguf_file_loads_at_run_time_as_its_written_checkpoint(dirs, tmp_path, monkeypatch):
    from gguf import GGMLQuantizationType
    from gguf_helpers import write_llama_gguf

    from tests.conftest import tiny_model
    from tritonlm import gguf_checkpoint

    monkeypatch.setattr(gguf_checkpoint, "CACHE", tmp_path / "written")
    _, plain = dirs
    files = tmp_path / "files"
    files.mkdir()
    gguf = write_llama_gguf(tiny_model(), files / "tiny.gguf", lambda name: GGMLQuantizationType.F32)
    (files / "broken.gguf").write_bytes(b"GGUF but not really")
    repository = tmp_path / "repository"
    repository.mkdir()
    config = FrontendConfig(model_dir=str(plain), embed_model_name="e", admin_api_key="k",
                            model_repository=str(repository), model_allowed_dirs=(str(files),))  # fmt: skip
    c = TestClient(create_app(config, triton=LoadingTriton()), raise_server_exceptions=False)
    headers = {"Authorization": "Bearer k"}
    r = c.post("/v1/models/tiny-file/load", json={"model_dir": str(gguf)}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["root"] == str(gguf_checkpoint.prepare(gguf))  # under the cache, config.json beside it
    r = c.post("/v1/models/broken/load", json={"model_dir": str(files / "broken.gguf")}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model_dir", r.text
    assert "cannot be read as a model" in r.json()["error"]["message"]
