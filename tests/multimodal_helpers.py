"""What the multimodal tests share: media made in memory (png, wav, mp4, data URLs) and transformers'
own greedy answer for a tiny checkpoint (`Reference`). The servers are conftest's
`multimodal_servers`, one per checkpoint for the whole session."""

from __future__ import annotations

import base64
import io
import json
import wave
from collections.abc import Collection
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image
from transformers import AutoProcessor

from tritonlm.multimodal.decode import decode_audio
from tritonlm.multimodal.encoder import MODEL_CLASSES
from tritonlm.multimodal.limits import MediaLimits
from tritonlm.multimodal.placeholders import expand_media


def png(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """A noise image: different seeds give images whose rows surely differ."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def wav(seconds: float, freq: float, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return out.getvalue()


def mp4(frames: int = 10) -> bytes:
    """A video whose frames differ in colour."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            image = Image.new("RGB", (64, 48), (20 * i, 255 - 20 * i, 90))
            container.mux(stream.encode(av.VideoFrame.from_image(image)))
        container.mux(stream.encode(None))
    return out.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class Reference:
    """transformers' greedy tokens for a checkpoint, with its processor (float32, no EOS stop:
    the servers are asked with ignore_eos)."""

    def __init__(self, model_dir: Path, new_tokens: int) -> None:
        self.processor = AutoProcessor.from_pretrained(model_dir)
        config_class = MODEL_CLASSES[json.loads((model_dir / "config.json").read_text())["architectures"][0]]
        self.model = config_class.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.new_tokens = new_tokens

    def chat(self, content: list[dict]) -> str:
        messages = [{"role": "user", "content": content}]
        return self.processor.apply_chat_template(messages, add_generation_prompt=True)

    def inputs(self, text: str, media: list[bytes], kind: str):
        """The processor's model inputs for `text` and the media files (decoded as the server does)."""
        processor = self.processor
        if kind == "image":
            images = [Image.open(io.BytesIO(data)).convert("RGB") for data in media]
            return processor(images=images or None, text=text, return_tensors="pt")
        rate = processor.feature_extractor.sampling_rate
        clips = [decode_audio(data, rate, MediaLimits(), "audio") for data in media]
        return processor(audio=clips or None, text=text, sampling_rate=rate, return_tensors="pt")

    def generate(self, text: str, media: list[bytes], kind: str) -> list[int]:
        inputs = self.inputs(text, media, kind)
        with torch.no_grad():
            out = self.model.generate(
                **inputs, max_new_tokens=self.new_tokens, do_sample=False, eos_token_id=None
            )
        generated = out[0, inputs.input_ids.shape[1] :].tolist()
        assert len(generated) == self.new_tokens
        return generated

    def decode(self, tokens: list[int]) -> str:
        return self.processor.tokenizer.decode(tokens, skip_special_tokens=True)


def expand_placeholders(
    ids: list[int], placeholder_id: int | Collection[int], rows_per_item: list[int], vocab_size: int
) -> list[int]:
    """`expand_media` without kinds: every placeholder id shares one numbering, in prompt order (a
    prompt with images and a video), its rows first in the table."""
    placeholders = [placeholder_id] if isinstance(placeholder_id, int) else placeholder_id
    return expand_media(ids, dict.fromkeys(placeholders, "media"), rows_per_item, vocab_size)


def prompt_table(features: list[np.ndarray]) -> np.ndarray:
    """The items' rows stacked as the engine's `prompt_embedding_table` [1, P, hidden]."""
    return np.concatenate(features, axis=0)[None].astype(np.float32)
