"""LLaVA-OneVision: its processor files read without torchvision, and its image and video rows.

transformers 5.23 builds `LlavaOnevisionProcessor` (and `AutoProcessor` of such a checkpoint) only
with torchvision, which has no build for this project's torch 2.13.0+cpu. `OnevisionProcessor` reads
the same `processor_config.json` (the layout `save_pretrained` writes) and uses the image
processor's PIL backend (`LlavaOnevisionImageProcessorPil`, the class transformers itself falls back
to) and, for video frames, the video processor's settings (resize to its size, rescale, normalize)
on transformers' PIL backend. The rows come from the model's own `get_image_features` /
`get_video_features`, called as its forward calls them, so they are what it merges at the
placeholder positions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoTokenizer, LlavaOnevisionImageProcessorPil, PreTrainedTokenizerBase
from transformers.image_processing_backends import PilBackend
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

ARCHITECTURE = "LlavaOnevisionForConditionalGeneration"
PROCESSOR_CONFIG = "processor_config.json"
# Where checkpoints saved before processor_config.json nested its parts keep them.
IMAGE_CONFIG, VIDEO_CONFIG = "preprocessor_config.json", "video_preprocessor_config.json"
# LlavaOnevisionVideoProcessor's defaults (transformers 5.23; its module needs torchvision to import).
VIDEO_PROCESSOR_DEFAULTS: dict[str, Any] = {
    "video_processor_type": "LlavaOnevisionVideoProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"height": 384, "width": 384},
    "resample": int(PILImageResampling.BICUBIC),
    "default_to_square": False,
    "do_center_crop": None,
    "crop_size": None,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": list(OPENAI_CLIP_MEAN),
    "image_std": list(OPENAI_CLIP_STD),
    "do_sample_frames": False,
}
# The steps of LlavaOnevisionVideoProcessor that apply to frames already sampled (it samples none
# itself: do_sample_frames is False in its defaults).
FRAME_KEYS = (
    "do_convert_rgb",
    "do_resize",
    "size",
    "resample",
    "do_center_crop",
    "crop_size",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
)


class OnevisionProcessor:
    """The parts of a LLaVA-OneVision checkpoint's processor the server uses."""

    def __init__(
        self,
        image_processor: LlavaOnevisionImageProcessorPil,
        video_settings: dict[str, Any],
        tokenizer: PreTrainedTokenizerBase,
        settings: dict[str, Any],
    ) -> None:
        self.image_processor = image_processor
        self.video_settings = video_settings
        self.frame_processor = PilBackend(**{k: video_settings[k] for k in FRAME_KEYS if k in video_settings})
        self.tokenizer = tokenizer
        self.settings = settings
        self.image_token: str = settings.get("image_token", "<image>")
        self.video_token: str = settings.get("video_token", "<video>")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> OnevisionProcessor:
        """Reads processor_config.json with its nested parts, or the older layout of one file per
        part; a checkpoint without video processor settings gets the video processor's defaults."""
        directory = Path(model_dir)
        config = _read(directory / PROCESSOR_CONFIG)
        image = config.pop("image_processor", None) or _read(directory / IMAGE_CONFIG)
        video = config.pop("video_processor", None) or _read(directory / VIDEO_CONFIG)
        video = {**VIDEO_PROCESSOR_DEFAULTS, **video}
        image_processor = LlavaOnevisionImageProcessorPil(**_without_type(image))
        return cls(image_processor, video, AutoTokenizer.from_pretrained(directory), config)

    def save_pretrained(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        config = {
            "image_processor": self.image_processor.to_dict(),
            "video_processor": self.video_settings,
            **self.settings,
            "processor_class": "LlavaOnevisionProcessor",
        }
        (out / PROCESSOR_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.tokenizer.save_pretrained(out)

    @property
    def video_num_frames(self) -> int | None:
        """The frame count the checkpoint's video processor samples by itself, if it does."""
        if self.video_settings.get("do_sample_frames"):
            return self.video_settings.get("num_frames")
        return None

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> str:
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)

    def image_inputs(self, image: Image.Image, images_in_prompt: int = 1) -> dict[str, torch.Tensor]:
        """pixel_values, image_sizes and batch_num_images of one image. In a prompt with several
        images, the processor does not tile them (anyres): each is padded to a square and resized,
        the path `batch_num_images` != 1 selects; LlavaOnevisionImageProcessorPil.preprocess
        derives that list from nesting, which one image alone cannot express, so it is passed."""
        out = PilBackend.preprocess(self.image_processor, [image], [images_in_prompt], return_tensors="pt")
        out["batch_num_images"] = torch.tensor([images_in_prompt])
        return dict(out)

    def video_inputs(self, frames: list[Image.Image]) -> torch.Tensor:
        """pixel_values_videos [1, frames, channels, height, width] of one video's sampled frames."""
        return self.frame_processor(images=frames, return_tensors="pt").pixel_values[None]


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _without_type(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in ("image_processor_type", "processor_class")}


def image_rows(
    model, processor: OnevisionProcessor, image: Image.Image, images_in_prompt: int
) -> torch.Tensor:
    """[rows, hidden]: the image's features, anyres tiles unpadded with newline rows (or base + one
    newline in a multi-image prompt), as LlavaOnevisionModel.forward computes them."""
    config = model.config
    inputs = processor.image_inputs(image, images_in_prompt)
    out = model.model.get_image_features(
        inputs["pixel_values"].to(model.device, model.dtype),
        inputs["image_sizes"].to(model.device),
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        batch_num_images=inputs["batch_num_images"],
    )
    return out.pooler_output[0].cpu()


def video_rows(model, processor: OnevisionProcessor, frames: list[Image.Image]) -> torch.Tensor:
    """[rows, hidden]: every frame's features pooled 2x, then one newline row, as the forward does."""
    config = model.config
    out = model.model.get_video_features(
        processor.video_inputs(frames).to(model.device, model.dtype),
        vision_feature_layer=config.vision_feature_layer,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
    )
    return out.pooler_output.flatten(0, 1).cpu()
