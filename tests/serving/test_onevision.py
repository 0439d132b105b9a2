"""LLaVA-OneVision (images and video): the tiny checkpoint, the encoder's rows against the processor's
placeholder rule, the engine's greedy tokens against transformers generate, and the video frames the
server samples (count and positions).

transformers 5.23 cannot build LlavaOnevisionProcessor without torchvision (none exists for torch
2.13.0+cpu), so the reference inputs are built from its parts: the image processor (PIL backend) for
pixels, the processor class's own `replace_image_token` / `replace_video_token` for the placeholder
counts, and `model.generate` (which checks that the counts match its features) for the tokens."""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import av
import numpy as np
import pytest
import torch
from multimodal_helpers import expand_placeholders, prompt_table
from PIL import Image
from transformers import LlavaOnevisionProcessor

from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.model_gen import multimodal as checkpoints
from tritonlm.multimodal.architectures import media_kinds
from tritonlm.multimodal.decode import frame_positions, sample_video_frames
from tritonlm.multimodal.encoder import MediaEncoder
from tritonlm.multimodal.limits import DEFAULT_VIDEO_FRAMES, MediaLimits
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.worker.model_runner import ModelRunner

NEW_TOKENS = 8
MAX_LEN = 640
PART = "messages[0].content[0]"
SIZES = [(40, 40), (50, 40), (40, 10), (1000, 20), (200, 90), (30, 300), (400, 400)]  # (width, height)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return checkpoints.generate(tmp_path_factory.mktemp("ov") / "llava_onevision", "llava_onevision")


@pytest.fixture(scope="module")
def encoder(built):
    return MediaEncoder(built)


@pytest.fixture(scope="module")
def runner(built):
    return ModelRunner(EngineConfig(str(built), max_num_seqs=2, max_seq_len=MAX_LEN, dtype="float32"))


def rule(encoder: MediaEncoder) -> LlavaOnevisionProcessor:
    """LlavaOnevisionProcessor holding only what its placeholder rule reads (its __init__ needs
    torchvision): the methods are transformers' own."""
    processor = object.__new__(LlavaOnevisionProcessor)
    settings = encoder.processor.settings
    processor.image_processor = encoder.processor.image_processor
    processor.image_token, processor.video_token = settings["image_token"], settings["video_token"]
    processor.num_image_tokens = settings["num_image_tokens"]
    processor.vision_feature_select_strategy = settings["vision_feature_select_strategy"]
    processor.vision_aspect_ratio = settings["vision_aspect_ratio"]
    return processor


def image(size: tuple[int, int], seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def mp4_bytes(frames: int, size: int = 48) -> bytes:
    """Frame i is a flat grey of level 12 * i, so a decoded frame tells its index."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            frame = Image.new("RGB", (size, size), (12 * i,) * 3)
            for packet in stream.encode(av.VideoFrame.from_image(frame)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def frame_index(frame: Image.Image) -> int:
    return round(float(np.asarray(frame.convert("L"), np.float32).mean()) / 12)


def expand(text_ids: list[int], token_id: int, counts: list[int], more: dict | None = None) -> list[int]:
    """The processor's prompt: each placeholder repeated as often as its rule says (`more`: other
    placeholder ids -> their counts)."""
    queues = {token_id: iter(counts), **{k: iter(v) for k, v in (more or {}).items()}}
    out: list[int] = []
    for t in text_ids:
        out.extend([t] * next(queues[t]) if t in queues else [t])
    return out


def chat(encoder: MediaEncoder, parts: list[dict]) -> str:
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe"}]}]
    return encoder.processor.apply_chat_template(messages, add_generation_prompt=True)


def generated(model, ids: torch.Tensor, **pixels) -> list[int]:
    """transformers' own greedy tokens for prompt `ids` with the processor's pixel inputs."""
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        **pixels,
    )
    return out[0, -NEW_TOKENS:].tolist()


def serve(runner: ModelRunner, ids: list[int], features: list[np.ndarray]) -> list[int]:
    tensors = {
        "input_ids": np.array([ids], np.int32),
        "request_output_len": np.array([[NEW_TOKENS]], np.int32),
        "prompt_embedding_table": prompt_table(features),
    }
    engine = Engine(runner, lambda s, n: None)
    seq = engine.add(parse_request(tensors, runner.vocab_size, MAX_LEN, hidden_size=runner.hidden_size))
    while engine.scheduler.has_work():
        engine.step()
    return seq.output_ids


def test_checkpoint_is_deterministic(built, tmp_path):
    again = checkpoints.generate(tmp_path / "again", "llava_onevision")
    for name in ("model.safetensors", "tokenizer.json", "processor_config.json"):
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (built, again)]
        assert digest[0] == digest[1], name
    assert media_kinds(built) == ("image", "video")


def test_older_layout_of_one_file_per_part(built, encoder, tmp_path):
    """Checkpoints saved before processor_config.json nested its parts keep one file per part."""
    older = shutil.copytree(built, tmp_path / "older")
    config = json.loads((older / "processor_config.json").read_text())
    (older / "preprocessor_config.json").write_text(json.dumps(config.pop("image_processor")))
    (older / "video_preprocessor_config.json").write_text(json.dumps(config.pop("video_processor")))
    (older / "processor_config.json").write_text(json.dumps(config))
    again = MediaEncoder(older)
    item, frames = image((90, 200)), [image((30, 30), seed=i) for i in range(3)]
    assert torch.equal(again.encode("image", item), encoder.encode("image", item))
    assert torch.equal(again.encode("video", frames), encoder.encode("video", frames))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("images_in_prompt", [1, 3])
def test_image_rows_are_the_processors_count(encoder, size, images_in_prompt):
    item = image(size)
    rows = encoder.encode("image", item, images_in_prompt=images_in_prompt)
    inputs = encoder.processor.image_inputs(item, images_in_prompt)
    expected = rule(encoder).replace_image_token(inputs, 0).count("<image>")
    assert rows.shape == (expected, encoder.hidden_size)
    if images_in_prompt > 1:
        assert expected == 25 + 1  # one untiled 5x5 tile and its newline row


@pytest.mark.parametrize("frames", [1, 4, 7])
def test_video_rows_are_the_processors_count(encoder, frames):
    items = [image((60, 30), seed=i) for i in range(frames)]
    rows = encoder.encode("video", items)
    inputs = {"pixel_values_videos": encoder.processor.video_inputs(items)}
    assert rows.shape[0] == rule(encoder).replace_video_token(inputs, 0).count("<video>") == frames * 9 + 1


@pytest.mark.parametrize(
    "sizes", [[(200, 90)], [(50, 40)], [(50, 40), (30, 300)]], ids=["wide", "small", "two"]
)
def test_engine_serves_images_like_transformers(encoder, runner, sizes):
    """One image is tiled (anyres); two in a prompt are not (the processor nests them, as its chat
    path does): the engine's greedy tokens equal transformers generate either way."""
    processor, model = encoder.processor, encoder.model
    items = [image(size, seed=k) for k, size in enumerate(sizes)]
    text = chat(encoder, [{"type": "image"}] * len(items))
    inputs = processor.image_processor(images=[items], return_tensors="pt")
    counts = [rule(encoder).replace_image_token(inputs, k).count("<image>") for k in range(len(items))]
    text_ids = processor.tokenizer(text).input_ids
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    ids = torch.tensor([expand(text_ids, image_id, counts)])
    expected = generated(
        model,
        ids,
        pixel_values=inputs.pixel_values,
        image_sizes=inputs.image_sizes,
        batch_num_images=inputs.batch_num_images,
    )

    features = [encoder.encode("image", item, images_in_prompt=len(items)).numpy() for item in items]
    assert [len(f) for f in features] == counts
    served_ids = expand_placeholders(text_ids, image_id, counts, runner.vocab_size)
    assert serve(runner, served_ids, features) == expected


def test_engine_serves_video_like_transformers(encoder, runner):
    """The frames the server samples from an mp4, through the engine, give transformers generate's
    tokens for the same frames (pixels from the video processor's settings, see onevision.py)."""
    processor, model = encoder.processor, encoder.model
    limits = MediaLimits(video_frames=6)
    frames = sample_video_frames(mp4_bytes(20), encoder.video_frames(limits), limits, PART)
    text = chat(encoder, [{"type": "video"}])
    pixels = processor.video_inputs(frames)
    count = rule(encoder).replace_video_token({"pixel_values_videos": pixels}, 0).count("<video>")
    text_ids = processor.tokenizer(text).input_ids
    video_id = processor.tokenizer.convert_tokens_to_ids("<video>")
    ids = torch.tensor([expand(text_ids, video_id, [count])])
    expected = generated(model, ids, pixel_values_videos=pixels)

    features = [encoder.encode("video", frames).numpy()]
    assert len(features[0]) == count == 6 * 9 + 1
    assert (
        serve(runner, expand_placeholders(text_ids, video_id, [count], runner.vocab_size), features)
        == expected
    )


def test_engine_serves_a_video_and_an_image_in_one_prompt(encoder, runner):
    """Both kinds share one table, numbered in prompt order (video first here); the model's forward
    scatters each kind at its own token."""
    processor, model = encoder.processor, encoder.model
    frames, item = [image((64, 48), seed=10 + i) for i in range(3)], image((90, 70), seed=3)
    text = chat(encoder, [{"type": "video"}, {"type": "image"}])
    inputs = processor.image_processor(images=[[item]], return_tensors="pt")
    pixels = processor.video_inputs(frames)
    image_count = rule(encoder).replace_image_token(inputs, 0).count("<image>")
    video_count = rule(encoder).replace_video_token({"pixel_values_videos": pixels}, 0).count("<video>")
    tokenizer = processor.tokenizer
    image_id, video_id = (
        tokenizer.convert_tokens_to_ids("<image>"),
        tokenizer.convert_tokens_to_ids("<video>"),
    )
    text_ids = tokenizer(text).input_ids
    ids = torch.tensor([expand(text_ids, image_id, [image_count], {video_id: [video_count]})])
    expected = generated(
        model,
        ids,
        pixel_values=inputs.pixel_values,
        image_sizes=inputs.image_sizes,
        batch_num_images=inputs.batch_num_images,
        pixel_values_videos=pixels,
    )

    features = [encoder.encode("video", frames).numpy(), encoder.encode("image", item).numpy()]
    counts = [len(f) for f in features]
    assert counts == [video_count, image_count]
    served_ids = expand_placeholders(text_ids, {video_id, image_id}, counts, runner.vocab_size)
    assert serve(runner, served_ids, features) == expected


def test_video_frames_count_and_positions(encoder):
    """The documented rule: MEDIA_VIDEO_FRAMES, else the checkpoint's video processor's own count,
    else 32; never over MEDIA_MAX_VIDEO_FRAMES; at np.linspace(0, total - 1, n) rounded."""
    assert encoder.video_frames(MediaLimits()) == DEFAULT_VIDEO_FRAMES == 32  # its processor samples none
    assert MediaLimits.from_env({"MEDIA_VIDEO_FRAMES": "8"}).frames_per_video() == 8
    assert MediaLimits().frames_per_video(checkpoint_frames=16) == 16
    assert MediaLimits(video_frames=8).frames_per_video(checkpoint_frames=16) == 8
    assert MediaLimits(max_video_frames=4).frames_per_video() == 4

    data = mp4_bytes(20)
    limits = MediaLimits.from_env({"MEDIA_VIDEO_FRAMES": "8"})
    frames = sample_video_frames(data, encoder.video_frames(limits), limits, PART)
    assert frame_positions(20, 8) == [0, 3, 5, 8, 11, 14, 16, 19]
    assert [frame_index(f) for f in frames] == [0, 3, 5, 8, 11, 14, 16, 19]
    # A video shorter than the count gives every frame, once.
    frames = sample_video_frames(mp4_bytes(5), encoder.video_frames(MediaLimits()), MediaLimits(), PART)
    assert [frame_index(f) for f in frames] == [0, 1, 2, 3, 4]
