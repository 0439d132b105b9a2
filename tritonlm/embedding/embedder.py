"""Texts -> sentence vectors with a transformers encoder, pooled and normalised as the model's
sentence-transformers configuration says. The logic of model_repository/embedding; no Triton here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's usual alias
from transformers import AutoModel, AutoTokenizer

from tritonlm import platforms
from tritonlm.embedding.config import SentenceConfig

log = logging.getLogger(__name__)


def with_instruction(text: str, instruction: str) -> str:
    """The instruction goes first, as instruction-tuned embedders (BGE, Instructor) expect, joined
    by one space unless it already ends in whitespace."""
    if not instruction:
        return text
    return instruction + text if instruction[-1].isspace() else f"{instruction} {text}"


def resolve_device(name: str) -> torch.device:
    return platforms.resolve_device(name)


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """sentence-transformers' Pooling: [batch, seq, hidden] -> [batch, hidden * len(modes)], padding
    positions (mask 0) left out; several modes are concatenated in `modes`' order."""
    mask_f = mask.unsqueeze(-1).to(hidden.dtype)
    count = mask_f.sum(dim=1).clamp(min=1e-9)
    vectors = []
    for mode in modes:
        if mode == "cls":
            vectors.append(hidden[torch.arange(len(hidden)), mask.int().argmax(dim=1)])
        elif mode == "max":
            vectors.append(hidden.masked_fill(mask_f == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            vectors.append((hidden * mask_f).sum(dim=1) / count)
        elif mode == "mean_sqrt_len_tokens":
            vectors.append((hidden * mask_f).sum(dim=1) / count.sqrt())
        elif mode == "lasttoken":  # the last real token, whichever side the padding is on
            last = mask.shape[1] - 1 - mask.int().flip(1).argmax(dim=1)
            vectors.append(hidden[torch.arange(len(hidden)), last])
        else:
            raise ValueError(f"unsupported pooling mode {mode!r}")
    return torch.cat(vectors, dim=-1)


class Embedder:
    """Loads tokenizer + encoder from a directory; `encode` embeds a batch in one forward pass."""

    def __init__(self, directory: str | Path, device: str = "auto") -> None:
        self.config = SentenceConfig.load(Path(directory))
        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        # float32 on every device: the model is small, and half precision would move the vectors.
        self.model = AutoModel.from_pretrained(directory, dtype=torch.float32).to(self.device).eval()
        if self.config.max_seq_length:
            self.max_length = self.config.max_seq_length
        else:  # sentence-transformers' fallback: what both the tokenizer and the positions allow
            positions = getattr(self.model.config, "max_position_embeddings", None) or 512
            self.max_length = min(positions, self.tokenizer.model_max_length)
        self.dimension = self.model.config.hidden_size * len(self.config.pooling)
        # Lengths padded to a multiple of 16 (when that never passes max_length): every new [batch,
        # length] shape costs oneDNN a cached kernel (up to 1,024 of them), so fewer shapes keep
        # the process's memory flat under varied traffic.
        self.pad_multiple = 16 if self.max_length % 16 == 0 else None
        log.info(
            "embedding model %s on %s: pooling %s, normalize %s, max %d tokens, %d dimensions",
            directory, self.device, self.config.pooling, self.config.normalize, self.max_length,
            self.dimension,
        )  # fmt: skip

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """([len(texts), dimension] float32 vectors, [len(texts)] int32 token counts). Texts over
        `max_length` tokens (special tokens included) are truncated, as sentence-transformers does."""
        if not texts:
            return np.zeros((0, self.dimension), np.float32), np.zeros((0,), np.int32)
        if self.config.do_lower_case:
            texts = [t.lower() for t in texts]
        batch = self.tokenizer(
            texts,
            padding=True,
            pad_to_multiple_of=self.pad_multiple,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        ).to(self.device)
        hidden = self.model(**batch).last_hidden_state
        vectors = pool(hidden, batch["attention_mask"], self.config.pooling)
        if self.config.normalize:
            vectors = F.normalize(vectors, p=2, dim=1)
        counts = batch["attention_mask"].sum(dim=1)
        return vectors.float().cpu().numpy(), counts.to(torch.int32).cpu().numpy()
