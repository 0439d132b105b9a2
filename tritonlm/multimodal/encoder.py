"""The checkpoint's own media encoders: each media item becomes rows of a prompt embedding table.

`MediaEncoder(model_dir)` loads the model and its processor (`save_pretrained` files) and, per item,
runs the vision tower / audio encoder and the projector exactly as the model's forward does, so the
rows equal what transformers merges at the placeholder positions. The number of rows is the
number of placeholder positions the processor's own rule gives (transformers checks they agree).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoProcessor,
    LlavaForConditionalGeneration,
    LlavaOnevisionForConditionalGeneration,
    Qwen2AudioForConditionalGeneration,
)
from transformers.masking_utils import create_bidirectional_mask

from tritonlm import platforms
from tritonlm.multimodal import onevision
from tritonlm.multimodal.architectures import MEDIA_KINDS, architecture
from tritonlm.multimodal.limits import MediaLimits

# Architecture -> the model class to load (the media each takes: architectures.MEDIA_KINDS).
MODEL_CLASSES = {
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    onevision.ARCHITECTURE: LlavaOnevisionForConditionalGeneration,
    "Qwen2AudioForConditionalGeneration": Qwen2AudioForConditionalGeneration,
}


def language_model_class(config) -> type:
    """The class the engine loads a checkpoint with: a multimodal one's own class (its language
    model serves; the towers stay idle there), else AutoModelForCausalLM."""
    for name in config.architectures or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    return AutoModelForCausalLM


class MediaEncoder:
    """`device`: where the towers run, "auto" as the engine's setting (float32 there too: the rows
    must be what transformers makes)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu") -> None:
        name = architecture(model_dir)
        if name not in MODEL_CLASSES:
            raise ValueError(f"{model_dir} is not a multimodal checkpoint this server can encode")
        model_class, self.kinds = MODEL_CLASSES[name], MEDIA_KINDS[name]
        self.device = platforms.resolve_device(device)
        self.model = model_class.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.onevision = name == onevision.ARCHITECTURE
        # OneVision's AutoProcessor needs torchvision (see onevision.py).
        loader = onevision.OnevisionProcessor if self.onevision else AutoProcessor
        self.processor = loader.from_pretrained(model_dir)
        config = self.model.config
        self.hidden_size = config.get_text_config().hidden_size
        self.placeholder_token = {
            "image": getattr(self.processor, "image_token", None),
            "audio": getattr(self.processor, "audio_token", None),
            "video": getattr(self.processor, "video_token", None),
        }

    def video_frames(self, limits: MediaLimits) -> int:
        """How many frames to sample from a video (`sample_video_frames`): MediaLimits.frames_per_video
        with the checkpoint's own count, if its video processor samples frames itself."""
        return limits.frames_per_video(getattr(self.processor, "video_num_frames", None))

    def towers_only(self) -> MediaEncoder:
        """Frees the language model (the engine serves it; encoding never runs it) and moves the
        rest to `device`."""
        self.model.model.language_model = None
        self.model.lm_head = None
        self.model.to(self.device)
        return self

    @property
    def sampling_rate(self) -> int:
        return self.processor.feature_extractor.sampling_rate

    @torch.no_grad()
    def encode(self, kind: str, item: object, images_in_prompt: int = 1) -> torch.Tensor:
        """[rows, hidden] features of one item: a PIL image, a video's sampled frames (list of PIL
        images), or mono float32 samples at `sampling_rate`. `images_in_prompt`: the images of the
        item's prompt (LLaVA-OneVision tiles an image only when it is the prompt's only one)."""
        return self.encode_many(kind, [item], images_in_prompt)[0]

    @torch.no_grad()
    def encode_many(self, kind: str, items: list, images_in_prompt: int = 1) -> list[torch.Tensor]:
        """Each item's [rows, hidden] features, from one forward pass for all of them (the rows equal
        encoding each alone: images are resized to one shape, audio padded to one window and masked).
        LLaVA-OneVision's items go one at a time: their anyres tiles differ in shape."""
        if kind not in self.kinds:
            raise ValueError(f"this model accepts {', '.join(self.kinds)}, not {kind}")
        if self.onevision and kind == "video":
            return [onevision.video_rows(self.model, self.processor, frames) for frames in items]
        if self.onevision:
            return [
                onevision.image_rows(self.model, self.processor, image, images_in_prompt) for image in items
            ]
        if kind == "image":
            return self._images(items)
        return self._audio(items)

    def _images(self, images: list) -> list[torch.Tensor]:
        config = self.model.config
        pixels = self.processor.image_processor(images=images, return_tensors="pt").pixel_values
        out = self.model.model.get_image_features(
            pixel_values=pixels.to(self.device, self.model.dtype),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
        )
        return [features.reshape(-1, self.hidden_size).cpu() for features in out.pooler_output]

    def _audio(self, clips: list[np.ndarray]) -> list[torch.Tensor]:
        # The processor's settings: padded to the extractor's window, with the mask giving the real length.
        inputs = self.processor.feature_extractor(
            clips,
            sampling_rate=self.sampling_rate,
            return_attention_mask=True,
            padding="max_length",
            return_tensors="pt",
        )
        features = inputs.input_features.to(self.device, self.model.dtype)
        mask = inputs.attention_mask.to(self.device)
        tower = self.model.model.audio_tower
        feat_lengths, out_lengths = tower._get_feat_extract_output_lengths(mask.sum(-1))
        max_len = (features.shape[-1] - 2) // 2 + 1
        keep = (torch.arange(max_len, device=self.device)[None, :] < feat_lengths[:, None]).long()
        # Qwen2Audio's forward builds the encoder's bidirectional mask from `keep` the same way.
        attention = create_bidirectional_mask(
            config=tower.config,
            inputs_embeds=torch.zeros(len(clips), max_len, 1, dtype=features.dtype, device=self.device),
            attention_mask=keep,
        )
        hidden = tower(features, attention_mask=attention).last_hidden_state
        rows = self.model.model.multi_modal_projector(hidden).cpu()
        return [rows[i, : int(n)] for i, n in enumerate(out_lengths)]
