"""The multimodal_encoder model and its wiring, on a real tritonserver with the real model repository:
images (tiny Llava) and audio (tiny Qwen2Audio) through the gRPC ensemble and through the
frontend's EngineClient give transformers' own greedy tokens (generate with the checkpoint's
processor), bad media fail naming their item, text still works, concurrent requests keep their own
media. One server per checkpoint for the session (conftest's multimodal_servers)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from PIL import Image
from transformers.image_utils import load_image

from client.stream import StreamClient
from frontend.engine_client.request import Job, MediaItem
from frontend.engine_client.steps import generate, prompt_tokens
from frontend.engine_client.triton import TritonClient
from frontend.errors import APIError
from tests.conftest import Servers
from tests.multimodal_helpers import Reference, png, wav
from tritonlm.config import checkpoint_vocab_size
from tritonlm.errors import InvalidRequest
from tritonlm.multimodal.architectures import placeholders
from tritonlm.multimodal.decode import decode_image
from tritonlm.multimodal.limits import MediaLimits
from tritonlm.multimodal.service import EncoderService
from tritonlm.text.preprocess import Preprocessor
from tritonlm.text.tokenization import load_tokenizer

NEW_TOKENS = 12
MODELS = {"llava": "image", "qwen2_audio": "audio"}


@pytest.fixture(scope="module")
def built(multimodal_checkpoints) -> dict[str, Path]:
    return {name: multimodal_checkpoints(name) for name in MODELS}


@pytest.fixture(scope="module")
def llava(multimodal_servers) -> Servers:
    return multimodal_servers("llava")


@pytest.fixture(scope="module")
def qwen2_audio(multimodal_servers) -> Servers:
    return multimodal_servers("qwen2_audio")


@pytest.fixture(scope="module")
def reference(built) -> dict[str, Reference]:
    return {name: Reference(built[name], NEW_TOKENS) for name in MODELS}


def ensemble(servers: Servers, values: dict) -> list[int]:
    client = StreamClient(servers.grpc_url)
    try:
        (response,) = list(
            client.generate("ensemble", {"max_tokens": NEW_TOKENS, "ignore_eos": True, **values})
        )
    finally:
        client.close()
    return response["output_ids"].reshape(-1).tolist()


def media_values(kind: str, media: list[bytes]) -> dict:
    return {
        "media": np.array([media], dtype=object),
        "media_kinds": np.array([[kind.encode()] * len(media)], dtype=object),
    }


def run_engine_client(servers: Servers, job: Job) -> list[int]:
    async def go() -> list[int]:
        client = TritonClient(servers.grpc_url)
        try:
            return [t.id for t in (await generate(client, job)).tokens]
        finally:
            await client.close()

    return asyncio.run(go())


def job(**fields) -> Job:
    return Job(max_tokens=NEW_TOKENS, sample=False, ignore_eos=True, **fields)


# ---------------------------------------------------------------------------------------------
# Without a server: the encoder's and preprocessing's logic, the frontend's wiring.


def preprocessor(model_dir: Path) -> Preprocessor:
    return Preprocessor(
        load_tokenizer(model_dir),
        max_seq_len=128,
        model_vocab_size=checkpoint_vocab_size(model_dir),
        placeholders=placeholders(model_dir),
    )


def text(value: object) -> np.ndarray:
    return np.array([json.dumps(value) if not isinstance(value, str) else value], dtype=object)


def test_images_are_decoded_as_transformers_loads_them(tmp_path):
    """Upright by their EXIF orientation, RGB: transformers' load_image, which its pipelines use."""
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to view
    path = tmp_path / "portrait.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(
        path, exif=exif
    )
    decoded = decode_image(path.read_bytes(), MediaLimits(), "media[0]")
    assert decoded.size == (30, 50)
    assert np.array_equal(np.asarray(decoded), np.asarray(load_image(str(path))))


def test_preprocessing_turns_each_placeholder_into_its_rows(built):
    pre = preprocessor(built["qwen2_audio"])
    vocab, audio = pre.model_vocab_size, pre.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert pre.placeholder_kinds == {audio: "audio"}
    rows = {
        "media_rows": np.array([[2, 3]], np.int32),
        "media_kinds": np.array([[b"audio", b"audio"]], dtype=object),
    }
    parts = [{"type": "audio"}, {"type": "text", "text": "and"}, {"type": "audio"}]
    out = pre.process({"prompt_parts": text(parts), "virtual_tokens": np.array([1], np.int32), **rows})
    ids = out["input_ids"][0].tolist()
    assert ids[0] == vocab  # the client's virtual row first, then the items' rows in order
    assert [i - vocab for i in ids if i >= vocab] == [0, 1, 2, 3, 4, 5]
    assert audio not in ids and out["input_token_texts"].tolist()[1:3] == [b"<|audio_bos|>", b""]
    # A chat message's media parts go to the template, which writes the placeholder.
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hear"}, {"type": "audio"}]}]
    one = {"media_rows": np.array([[4]], np.int32), "media_kinds": np.array([[b"audio"]], dtype=object)}
    chat = pre.process({"chat_messages": text(messages), **one})
    assert [i - vocab for i in chat["input_ids"][0].tolist() if i >= vocab] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "inputs, message",
    [
        (
            {"text_input": text("no placeholder"), "media_rows": np.array([[2]], np.int32)},
            "text_input: the prompt has 0 media placeholders for 1 media items",
        ),
        (
            {"prompt_parts": text([{"type": "image"}, {"type": "image"}])},
            "prompt_parts: the prompt has 2 media placeholders for 0 media items",
        ),
        (
            {"prompt_parts": text([{"type": "audio"}])},
            "prompt_parts[0]: expected a part of type text, image, got 'audio'",
        ),
        ({"prompt_parts": text('"<image>"')}, "prompt_parts must be a non-empty JSON list"),
        (
            {"chat_messages": text([{"role": "user", "content": [{"type": "video"}]}])},
            "content parts must be text or image",
        ),
        (
            {"prompt_parts": text([{"type": "image"}]), "media_rows": np.array([[0]], np.int32)},
            "media_rows must be >= 1",
        ),
        (
            {
                "prompt_parts": text([{"type": "image"}, {"type": "text", "text": "x y z"}]),
                "media_rows": np.array([[49]], np.int32),
                "truncate": np.array([3], np.int32),
            },
            "truncate: keeping the last 3 tokens would cut a media item",
        ),
        (
            {
                "prompt_parts": text([{"type": "image"}]),
                "media_rows": np.array([[200]], np.int32),
                "truncate_to_fit": np.array([True]),
            },
            "cutting it to fit would cut its media",
        ),
        (
            {"text_input": text("x"), "prompt_parts": text([{"type": "text", "text": "y"}])},
            "not both text_input and prompt_parts",
        ),
    ],
)
def test_preprocessing_refuses_media_that_do_not_pair_up(built, inputs, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        preprocessor(built["llava"]).process(inputs)


def test_a_text_only_model_still_refuses_media_parts(model_dir):
    pre = preprocessor(model_dir)
    with pytest.raises(InvalidRequest, match="this model is text-only"):
        pre.process({"chat_messages": text([{"role": "user", "content": [{"type": "image"}]}])})
    with pytest.raises(InvalidRequest, match="media_rows: this model is text-only"):
        pre.process({"text_input": text("hi"), "media_rows": np.array([[3]], np.int32)})


class Recorder:
    """A Triton that records calls: the encoder answers two rows per item, the engine one step."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, np.ndarray]]] = []

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append((model, inputs))
        if model == "multimodal_encoder":
            items = inputs["media"].shape[1]
            return {
                "prompt_embedding_table": np.zeros((1, 2 * items, 4), np.float32),
                "media_rows": np.full((1, items), 2, np.int32),
            }
        return {"input_ids": np.array([[1, 2]], np.int32), "request_output_len": np.array([[3]], np.int32)}

    async def stream(self, model: str, inputs: dict[str, np.ndarray], outputs=None):
        self.calls.append((model, inputs))
        yield {"output_ids": np.array([[7]], np.int32), "finish_reason": np.array([b"length"], dtype=object)}


def test_the_engine_client_calls_the_encoder_only_for_media():
    async def run(job: Job) -> list[tuple[str, dict[str, np.ndarray]]]:
        triton = Recorder()
        await generate(triton, job)
        return triton.calls

    items = (MediaItem("image", b"a", "inputs[0]"), MediaItem("image", b"b", "inputs[2]"))
    (encoder, enc_in), (pre, pre_in), (engine, eng_in) = asyncio.run(
        run(job(prompt_parts=[{"type": "image"}] * 2, media=items))
    )
    assert (encoder, pre, engine) == ("multimodal_encoder", "preprocessing", "engine")
    assert set(enc_in) == {"media", "media_kinds"} and enc_in["media"].tolist() == [[b"a", b"b"]]
    assert pre_in["media_rows"].tolist() == [[2, 2]] and pre_in["media_kinds"].tolist() == [
        [b"image", b"image"]
    ]
    assert json.loads(pre_in["prompt_parts"][0]) == [{"type": "image"}] * 2
    assert eng_in["prompt_embedding_table"].shape == (1, 4, 4) and "media" not in eng_in
    # Without media the client's own table goes straight to the engine.
    table = np.ones((3, 4), np.float16)
    (pre, _), (engine, eng_in) = asyncio.run(run(job(prompt="Hi", prompt_embeds=table)))
    assert (pre, engine) == ("preprocessing", "engine")
    assert eng_in["prompt_embedding_table"].dtype == np.float32 and eng_in[
        "prompt_embedding_table"
    ].shape == (1, 3, 4)


def test_job_names_a_media_error_by_its_content_part():
    items = (
        MediaItem("image", b"a", "messages[0].content[1]"),
        MediaItem("audio", b"b", "messages[1].content[0]"),
    )
    named = job(messages=[], media=items).named(
        APIError(422, "media[1]: the bytes are not a supported audio file")
    )
    assert named.param == "messages[1].content[0]" and named.status == 400
    assert named.message == "messages[1].content[0]: the bytes are not a supported audio file"
    named = job(prompt_parts=[], media=items, prompt_param="inputs").named(
        APIError(422, "prompt_parts: the prompt has 1 media placeholders for 2 media items")
    )
    assert named.param == "inputs" and named.message.startswith("inputs: the prompt has 1")


def test_encoder_service_batches_requests_and_fails_only_the_bad_one(built):
    service = EncoderService(built["llava"])
    good = [png(1), png(2)]
    inputs = [
        media_values("image", good),
        media_values("image", [png(3), b"not an image"]),
        {"prompt_embedding_table": np.ones((1, 2, 64), np.float32)},  # passed through untouched
        {**media_values("image", [png(3)]), "prompt_embedding_table": np.ones((1, 2, 64), np.float32)},
    ]
    first, bad, passed, with_table = service.process(inputs)
    alone = service.process([media_values("image", [png(1)])])[0]
    assert first["media_rows"].tolist() == [[49, 49]] and first["prompt_embedding_table"].shape == (1, 98, 64)
    assert np.array_equal(first["prompt_embedding_table"][:, :49], alone["prompt_embedding_table"])
    assert str(bad) == "[invalid argument] media[1]: the bytes are not a supported image (jpg, png)"
    assert passed["prompt_embedding_table"].shape == (1, 2, 64) and "media_rows" not in passed
    assert "virtual_tokens" in str(with_table)  # the client's rows must be its virtual tokens
    with_table = service.process([{**inputs[3], "virtual_tokens": np.array([2], np.int32)}])[0]
    assert with_table["prompt_embedding_table"][0, :2].tolist() == np.ones((2, 64)).tolist()


def test_encoder_service_limits_and_kinds(built, model_dir):
    limits = MediaLimits(max_items=2, max_image_bytes=10_000, max_chat_image_bytes=10_000)
    service = EncoderService(built["llava"], limits)
    too_many, too_big, wrong_kind, unknown = service.process(
        [
            media_values("image", [png(1)] * 3),
            media_values("image", [png(1, (400, 400))]),
            media_values("audio", [wav(0.2, 440)]),
            media_values("gif", [png(1)]),
        ]
    )
    assert "media: 3 items, over the limit of 2" in str(too_many)
    assert "media[0]: the image has" in str(too_big) and "over the limit of 10000" in str(too_big)
    assert "media[0]: this model takes image, not audio" in str(wrong_kind)
    assert "media[0]: unknown media kind 'gif'" in str(unknown)
    text_only = EncoderService(model_dir)  # loads no tower
    assert text_only.encoder is None
    refused, table = text_only.process(
        [media_values("image", [png(1)]), {"prompt_embedding_table": np.ones((1, 2, 5), np.float32)}]
    )
    assert (
        str(refused)
        == "[invalid argument] media[0]: this model is text-only; it takes no image, video or audio"
    )
    assert table["prompt_embedding_table"].shape == (1, 2, 5)
    assert placeholders(model_dir) == {}


# ---------------------------------------------------------------------------------------------
# Through tritonserver.


def test_image_through_the_ensemble_equals_transformers(llava, reference):
    ref = reference["llava"]
    content = [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]
    expected = ref.generate(ref.chat(content), [png(7)], "image")
    values = {
        "chat_messages": json.dumps([{"role": "user", "content": content}]),
        **media_values("image", [png(7)]),
    }
    assert ensemble(llava, values) == expected
    # TGI's list inputs: the parts rendered without a template, each image as the processor's "<image>".
    parts = [
        {"type": "text", "text": "Look: "},
        {"type": "image"},
        {"type": "text", "text": " and "},
        {"type": "image"},
    ]
    expected = ref.generate("Look: <image> and <image>", [png(8), png(9)], "image")
    assert (
        ensemble(llava, {"prompt_parts": json.dumps(parts), **media_values("image", [png(8), png(9)])})
        == expected
    )


def test_audio_through_the_ensemble_and_the_engine_client_equals_transformers(qwen2_audio, reference):
    ref = reference["qwen2_audio"]
    clip = wav(1.3, 330)
    content = [{"type": "audio"}, {"type": "text", "text": "What do you hear?"}]
    expected = ref.generate(ref.chat(content), [clip], "audio")
    values = {
        "chat_messages": json.dumps([{"role": "user", "content": content}]),
        **media_values("audio", [clip]),
    }
    assert ensemble(qwen2_audio, values) == expected
    item = MediaItem("audio", clip, "messages[0].content[0]")
    messages = [{"role": "user", "content": content}]
    assert run_engine_client(qwen2_audio, job(messages=messages, media=(item,))) == expected
    parts = [{"type": "audio"}, {"type": "text", "text": "Transcribe"}]
    expected = ref.generate("<|audio_bos|><|AUDIO|><|audio_eos|>Transcribe", [clip], "audio")
    assert run_engine_client(qwen2_audio, job(prompt_parts=parts, media=(item,))) == expected


def test_image_through_the_engine_client_counts_its_positions(llava, reference):
    ref = reference["llava"]
    parts = [{"type": "image"}, {"type": "text", "text": "Describe it"}]
    items = (MediaItem("image", png(11), "inputs[0]"),)
    expected = ref.generate("<image>Describe it", [png(11)], "image")
    assert run_engine_client(llava, job(prompt_parts=parts, media=items, prompt_param="inputs")) == expected

    async def prompt() -> list[int]:
        client = TritonClient(llava.grpc_url)
        try:
            return (await prompt_tokens(client, job(prompt_parts=parts, media=items))).ids
        finally:
            await client.close()

    ids = asyncio.run(prompt())
    vocab = ref.model.config.text_config.vocab_size
    assert ids[:49] == list(range(vocab, vocab + 49))  # one position per image row
    assert len(ids) == len(
        ref.processor(images=[Image.new("RGB", (8, 8))], text="<image>Describe it").input_ids[0]
    )


def test_bad_media_fail_naming_their_item(llava):
    values = {"text_input": "<image><image>", **media_values("image", [png(1), b"\x89PNG but not really"])}
    with pytest.raises(RuntimeError, match=r"media\[1\]: the bytes are not a supported image") as error:
        ensemble(llava, values)
    assert "PNG but not" not in str(error.value)  # the file's bytes never come back
    with pytest.raises(RuntimeError, match="1 media placeholders for 2 media items"):
        ensemble(llava, {"text_input": "<image>", **media_values("image", [png(1), png(2)])})
    items = (
        MediaItem("image", png(1), "messages[0].content[1]"),
        MediaItem("image", b"nope", "messages[0].content[2]"),
    )
    content = [{"type": "text", "text": "Compare"}, {"type": "image"}, {"type": "image"}]
    with pytest.raises(APIError) as caught:
        run_engine_client(llava, job(messages=[{"role": "user", "content": content}], media=items))
    assert caught.value.status == 400 and caught.value.param == "messages[0].content[2]"
    assert caught.value.message.startswith("messages[0].content[2]: the bytes are not a supported image")


def test_text_still_works_on_a_multimodal_server(llava, reference):
    ref = reference["llava"]
    expected = ref.generate("Hello there", [], "image")
    assert ensemble(llava, {"text_input": "Hello there"}) == expected
    assert run_engine_client(llava, job(prompt="Hello there")) == expected


def test_concurrent_requests_keep_their_own_images(llava, reference):
    ref = reference["llava"]
    images = [png(21), png(22, (30, 90)), png(23, (120, 40))]
    parts = [{"type": "image"}, {"type": "text", "text": "Caption:"}]
    expected = [ref.generate("<image>Caption:", [image], "image") for image in images]
    assert len({tuple(e) for e in expected}) > 1  # the images do lead to different answers

    async def all_at_once() -> list[list[int]]:
        client = TritonClient(llava.grpc_url)
        try:
            jobs = [
                job(prompt_parts=parts, media=(MediaItem("image", image, "inputs[0]"),)) for image in images
            ]
            generations = await asyncio.gather(*(generate(client, j) for j in jobs))
            return [[t.id for t in g.tokens] for g in generations]
        finally:
            await client.close()

    before = encoder_counts(llava)
    assert asyncio.run(all_at_once()) == expected
    inferences, executions = (
        after - earlier for after, earlier in zip(encoder_counts(llava), before, strict=True)
    )
    assert inferences == 3 and executions < 3  # the dynamic batcher gave some of them one execute call


def encoder_counts(servers: Servers) -> tuple[int, int]:
    """multimodal_encoder's requests and execute calls so far (Triton's statistics)."""
    client = grpcclient.InferenceServerClient(servers.grpc_url)
    try:
        (stats,) = client.get_inference_statistics("multimodal_encoder", as_json=True)["model_stats"]
    finally:
        client.close()
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def test_a_text_only_server_refuses_media(servers):
    values = {"text_input": "Hi", **media_values("image", [png(1)])}
    with pytest.raises(RuntimeError, match=r"media\[0\]: this model is text-only"):
        ensemble(servers, values)
