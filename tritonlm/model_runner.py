"""Loads a transformers causal LM and runs one packed forward step over many sequences."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tritonlm import kv_cache
from tritonlm.kv_cache import SlotKVCache, StepLayout

log = logging.getLogger(__name__)


@dataclass
class EngineSettings:
    model_dir: str
    device: str = "auto"
    dtype: str = "auto"
    max_running_seqs: int = 32
    max_seq_len: int = 0  # 0: min(max_position_embeddings, 4096)

    @classmethod
    def from_parameters(cls, params: dict[str, str], model_dir: str) -> EngineSettings:
        """Reads config.pbtxt string parameters (empty means the default); `model_dir` is resolved
        by the caller (the parameter, else MODEL_DIR)."""
        settings = cls(model_dir=model_dir)
        for name in ("device", "dtype"):
            if params.get(name):
                setattr(settings, name, params[name])
        for name in ("max_running_seqs", "max_seq_len"):
            if params.get(name):
                setattr(settings, name, int(params[name]))
        return settings


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, config: object) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cpu":  # half precision matmuls are slow or missing on most CPUs
        return torch.float32
    checkpoint = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return checkpoint if checkpoint in (torch.float16, torch.bfloat16) else torch.bfloat16


class ModelRunner:
    def __init__(self, settings: EngineSettings):
        config = AutoConfig.from_pretrained(settings.model_dir)
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.dtype, self.device, config)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 4096)
        self.max_seq_len = settings.max_seq_len or min(limit, 4096)
        self.max_running_seqs = settings.max_running_seqs
        self.cache = SlotKVCache(settings.max_running_seqs, self.max_seq_len, self.dtype, self.device)
        self.model = AutoModelForCausalLM.from_pretrained(
            settings.model_dir, dtype=self.dtype, attn_implementation=kv_cache.register(self.cache)
        ).to(self.device)
        self.model.eval()
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        log.info(
            "engine settings: model_dir=%s device=%s dtype=%s max_running_seqs=%d max_seq_len=%d",
            settings.model_dir,
            self.device,
            self.dtype,
            self.max_running_seqs,
            self.max_seq_len,
        )

    @torch.inference_mode()
    def forward(self, token_lists: list[list[int]], starts: list[int], slots: list[int]) -> torch.Tensor:
        """Feeds each sequence's new tokens (after `starts[i]` cached ones) and returns the logits of
        each sequence's last token, [num_sequences, vocab]."""
        lengths = [len(t) for t in token_lists]
        layout = StepLayout(slots, starts, lengths, self.device)
        input_ids = torch.tensor([t for tokens in token_lists for t in tokens], device=self.device)[None, :]
        last = torch.tensor(lengths, device=self.device).cumsum(0) - 1
        self.cache.layout = layout
        try:
            out = self.model(
                input_ids=input_ids, position_ids=layout.position_ids(), use_cache=False, logits_to_keep=last
            )
        finally:
            self.cache.layout = None
        return out.logits[0]
