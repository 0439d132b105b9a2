"""Tiny multimodal checkpoints and their encoders: the prompt-table rows the encoder returns, put at
the expanded placeholder positions, give transformers' own greedy output token for token."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from multimodal_helpers import expand_placeholders, prompt_table
from PIL import Image

from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.model_gen import multimodal as checkpoints
from tritonlm.multimodal.architectures import media_kinds
from tritonlm.multimodal.encoder import MediaEncoder
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.worker.model_runner import ModelRunner

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mm")
    return {kind: checkpoints.generate(root / kind, kind) for kind in ("llava", "qwen2_audio")}


def sine(seconds: float, rate: int = 16000) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_checkpoints_are_deterministic(built, tmp_path):
    again = checkpoints.generate(tmp_path / "llava", "llava")
    for name in ("model.safetensors", "tokenizer.json", "processor_config.json"):
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (built["llava"], again)]
        assert digest[0] == digest[1], name
    assert media_kinds(built["llava"]) == ("image",) and media_kinds(built["qwen2_audio"]) == ("audio",)


def test_expand_placeholders():
    assert expand_placeholders([1, 7, 2, 7], 7, [2, 3], 100) == [1, 100, 101, 2, 102, 103, 104]
    with pytest.raises(ValueError, match="2 media placeholders for 1"):
        expand_placeholders([7, 7], 7, [1], 100)


@pytest.mark.parametrize("kind", ["llava", "qwen2_audio"])
def test_table_rows_reproduce_transformers_generate(built, kind):
    encoder = MediaEncoder(built[kind])
    processor, model = encoder.processor, encoder.model
    media = "image" if kind == "llava" else "audio"
    items = [Image.new("RGB", (50, 40), (10, 200, 30)), Image.new("RGB", (30, 60), (250, 0, 90))]
    items = items if media == "image" else [sine(1.0), sine(0.4)]
    content = [{"type": media}, {"type": "text", "text": "Compare"}, {"type": media}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    if media == "image":
        inputs = processor(images=items, text=text, return_tensors="pt")
    else:
        inputs = processor(audio=items, text=text, sampling_rate=encoder.sampling_rate, return_tensors="pt")
    expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)[0, -NEW_TOKENS:].tolist()

    features = [encoder.encode(media, item).numpy() for item in items]
    tokenizer = processor.tokenizer
    placeholder = tokenizer.convert_tokens_to_ids(encoder.placeholder_token[media])
    vocab = model.get_input_embeddings().num_embeddings
    ids = expand_placeholders(tokenizer(text).input_ids, placeholder, [len(f) for f in features], vocab)
    assert len(ids) == inputs.input_ids.shape[1]  # the processor's own count of positions
    table = torch.from_numpy(prompt_table(features)[0])
    ids_t = torch.tensor(ids)
    embeds = model.get_input_embeddings()(ids_t.clamp(max=vocab - 1))
    embeds[ids_t >= vocab] = table[ids_t[ids_t >= vocab] - vocab]
    out = model.generate(inputs_embeds=embeds[None], max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    assert out[-NEW_TOKENS:] == expected


@pytest.mark.parametrize("kind", ["llava", "qwen2_audio"])
def test_engine_serves_the_table_like_transformers(built, kind):
    """The engine loads the checkpoint's language model and reads media rows from the prompt table
    (issue 11's path): its greedy tokens equal transformers generate with the processor's inputs."""
    encoder = MediaEncoder(built[kind])
    processor, model = encoder.processor, encoder.model
    media = "image" if kind == "llava" else "audio"
    item = Image.new("RGB", (40, 40), (0, 90, 200)) if media == "image" else sine(0.7)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": media}, {"type": "text", "text": "Describe"}]}],
        add_generation_prompt=True,
    )
    if media == "image":
        inputs = processor(images=[item], text=text, return_tensors="pt")
    else:
        inputs = processor(audio=[item], text=text, sampling_rate=encoder.sampling_rate, return_tensors="pt")
    expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    features = [encoder.encode(media, item).numpy()]
    runner = ModelRunner(EngineConfig(str(built[kind]), max_num_seqs=2, max_seq_len=256))
    placeholder = processor.tokenizer.convert_tokens_to_ids(encoder.placeholder_token[media])
    ids = expand_placeholders(
        processor.tokenizer(text).input_ids, placeholder, [len(features[0])], runner.vocab_size
    )
    tensors = {
        "input_ids": np.array([ids], np.int32),
        "request_output_len": np.array([[NEW_TOKENS]], np.int32),
        "prompt_embedding_table": prompt_table(features),
    }
    engine = Engine(runner, lambda s, n: None)
    seq = engine.add(parse_request(tensors, runner.vocab_size, 256, hidden_size=runner.hidden_size))
    while engine.scheduler.has_work():
        engine.step()
    assert seq.output_ids == expected[0, -NEW_TOKENS:].tolist()
