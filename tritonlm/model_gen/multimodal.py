"""Tiny random-weight multimodal checkpoints for tests, built offline and deterministically.

    python -m tritonlm.model_gen.multimodal OUT_DIR {llava,llava_onevision,qwen2_audio} [--seed N]

Each directory is what `save_pretrained` writes for the model and its processor, so the server and
transformers load it the same way. The tokenizer is the tiny model's (trained on `corpus/`)
plus the architecture's media tokens; processors keep their defaults except where noted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    LlavaProcessor,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2AudioConfig,
    Qwen2AudioEncoderConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen2AudioProcessor,
    Qwen2Config,
    SiglipVisionConfig,
    WhisperFeatureExtractor,
)
from transformers.utils import logging as hf_logging

from tritonlm.model_gen.tiny import CHAT_TEMPLATE, IM_END, corpus_texts, train_tokenizer
from tritonlm.multimodal.onevision import VIDEO_PROCESSOR_DEFAULTS, OnevisionProcessor

# The default template keeps only text parts; media parts become their placeholder token here.
MEDIA_PART = (
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ('image', 'image_url') -%}{{- '<image>' -}}"
    "{%- elif part.type in ('video', 'video_url') -%}{{- '<video>' -}}"
    "{%- elif part.type in ('audio', 'audio_url', 'input_audio') -%}"
    "{{- '<|audio_bos|><|AUDIO|><|audio_eos|>' -}}{%- endif -%}"
)
TEXT_PART = "{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
MEDIA_TOKENS = ["<image>", "<video>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    dtype="float32",
)


def media_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = train_tokenizer(corpus_texts())
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in MEDIA_TOKENS], special_tokens=True
    )
    assert TEXT_PART in CHAT_TEMPLATE
    tokenizer.chat_template = CHAT_TEMPLATE.replace(TEXT_PART, MEDIA_PART)
    return tokenizer


def _ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    return dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def llava(tokenizer: PreTrainedTokenizerFast) -> tuple[PreTrainedModel, LlavaProcessor]:
    # CLIPImageProcessor's defaults (224x224 crop); patch 32 gives 7x7 = 49 image positions.
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=224,
        patch_size=32,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(vocab_size=len(tokenizer), **TEXT, **_ids(tokenizer)),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
    )
    processor = LlavaProcessor(
        CLIPImageProcessorPil(),
        tokenizer,
        patch_size=32,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
        chat_template=tokenizer.chat_template,
    )
    return LlavaForConditionalGeneration(config), processor


def qwen2_audio(tokenizer: PreTrainedTokenizerFast) -> tuple[PreTrainedModel, Qwen2AudioProcessor]:
    audio = Qwen2AudioEncoderConfig(
        d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128
    )
    config = Qwen2AudioConfig(
        audio_config=audio,
        text_config=Qwen2Config(vocab_size=len(tokenizer), **TEXT, **_ids(tokenizer)),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"),
    )
    processor = Qwen2AudioProcessor(
        WhisperFeatureExtractor(feature_size=128),
        tokenizer,
        chat_template=tokenizer.chat_template,
        audio_token="<|AUDIO|>",
        audio_bos_token="<|audio_bos|>",
        audio_eos_token="<|audio_eos|>",
    )
    return Qwen2AudioForConditionalGeneration(config), processor


# LLaVA-OneVision's tile: the defaults (SigLIP at 384 px, patch 14: 729 rows a tile, up to 37 tiles)
# scaled down to a 40 px tile of 5x5 patches, so an image is at most 25 + 15x15 + 15 = 265 rows and a
# video frame 3x3 pooled rows. 5 is odd on purpose: pooling rounds up (ceil(5 / 2) = 3).
OV_TILE, OV_PATCH = 40, 8


def llava_onevision(tokenizer: PreTrainedTokenizerFast) -> tuple[PreTrainedModel, OnevisionProcessor]:
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=OV_TILE,
        patch_size=OV_PATCH,
        vision_use_head=False,
    )
    # The default grid (1..6 x 1..6 tiles of 384 px) on the small tile.
    pinpoints = [[OV_TILE * i, OV_TILE * j] for i in range(1, 7) for j in range(1, 7)]
    config = LlavaOnevisionConfig(
        vision_config=vision,
        text_config=Qwen2Config(vocab_size=len(tokenizer), **TEXT, **_ids(tokenizer)),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=pinpoints,
    )
    size = {"height": OV_TILE, "width": OV_TILE}
    image = LlavaOnevisionImageProcessorPil(size=size, image_grid_pinpoints=pinpoints)
    video = {**VIDEO_PROCESSOR_DEFAULTS, "size": size}
    settings = {
        "image_token": "<image>",
        "video_token": "<video>",
        "num_image_tokens": (OV_TILE // OV_PATCH) ** 2,
        "vision_feature_select_strategy": "full",
        "vision_aspect_ratio": "anyres_max_9",
    }
    # Saved as LlavaOnevisionProcessor.save_pretrained would (that class needs torchvision).
    processor = OnevisionProcessor(image, video, tokenizer, settings)
    return LlavaOnevisionForConditionalGeneration(config), processor


BUILDERS: dict[str, Callable] = {
    "llava": llava,
    "llava_onevision": llava_onevision,
    "qwen2_audio": qwen2_audio,
}


def generate(out_dir: str | Path, kind: str, seed: int = 0) -> Path:
    out = Path(out_dir)
    tokenizer = media_tokenizer()
    torch.manual_seed(seed)  # the model's own initialisation draws from here: same seed, same weights
    model, processor = BUILDERS[kind](tokenizer)
    model = model.to(torch.float32).eval()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a tiny random multimodal checkpoint.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("kind", choices=sorted(BUILDERS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()
    print(f"{args.kind} -> {generate(args.out_dir, args.kind, args.seed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
